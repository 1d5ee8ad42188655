package policy

import (
	"bytes"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// syntaxLine splits a yaml.v3 syntax error into its line and message.
var syntaxLine = regexp.MustCompile(`(?s)^yaml: line (\d+): (.*)$`)

// document parses data into a node tree and returns its root, or nil after
// reporting why there is none.
func (d *decoder) document(data []byte) (root *yaml.Node) {
	defer func() {
		// yaml.v3 has panicked on hostile input before; a policy file must
		// never take the process down.
		if r := recover(); r != nil {
			d.addf(Position{File: d.file, Line: 1, Column: 1}, "YAML parser failed: %v", r)
			root = nil
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.addf(Position{File: d.file, Line: 1, Column: 1}, "the file is empty; a policy starts with version: 1")
			return nil
		}
		d.syntax(err)
		return nil
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		d.addf(d.pos(&extra), "a policy file holds one YAML document; remove everything from this second document on")
	case !errors.Is(err, io.EOF):
		d.syntax(err)
		return nil
	}
	if len(doc.Content) == 0 {
		d.addf(Position{File: d.file, Line: 1, Column: 1}, "the file is empty; a policy starts with version: 1")
		return nil
	}
	root = resolve(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		d.addf(d.pos(root), "a policy must be a mapping of sections (version: 1, ingress: ...), got %s", describe(root))
		return nil
	}
	return root
}

// parserProblems are yaml.v3's parser (as opposed to scanner) errors. It
// reports their line 0-based, and omits it when it is 0; scanner errors
// carry a 1-based line.
var parserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"did not find expected node content":     true,
	"did not find expected '-' indicator":    true,
	"did not find expected key":              true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found duplicate %TAG directive":         true,
	"found undefined tag handle":             true,
}

// syntax reports a YAML syntax error. yaml.v3 gives only a line, so the
// column is 1.
func (d *decoder) syntax(err error) {
	msg, line := strings.TrimPrefix(err.Error(), "yaml: "), 0
	if m := syntaxLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	if parserProblems[msg] {
		line++
	}
	d.addf(Position{File: d.file, Line: max(line, 1), Column: 1}, "YAML syntax error: %s", msg)
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 8; i++ {
		n = n.Alias
	}
	return n
}
