package policy

import (
	"fmt"
	"strings"
)

// Issue is one finding about a policy file, located at FILE:LINE:COL.
type Issue struct {
	Pos     Position
	Message string
}

func (i Issue) String() string {
	return fmt.Sprintf("%s:%d:%d: %s", i.Pos.File, i.Pos.Line, i.Pos.Column, i.Message)
}

// Errors is every error found in one policy file, in file order.
type Errors []Issue

func (e Errors) Error() string {
	lines := make([]string, len(e))
	for i, is := range e {
		lines[i] = is.String()
	}
	return strings.Join(lines, "\n")
}
