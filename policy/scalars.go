package policy

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Scalar decoding. Each function checks the node's YAML type first (a quoted
// "5" is a string, never an int), then the check-tag rules, and reports at
// the value's position.

// integer decodes an int: non-negative unless signed, at least c.min.
func (d *decoder) integer(path string, n *yaml.Node, c checks) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != tagInt {
		d.typeErr(path, n, "an integer")
		return 0, false
	}
	i, ok := decimal(n)
	if !ok {
		if err := n.Decode(&i); err != nil {
			d.failf(path, n, "%s is not an integer warden can hold", n.Value)
			return 0, false
		}
	}
	switch {
	case !c.signed && i < 0:
		d.failf(path, n, "%d must not be negative", i)
		return 0, false
	case c.min > 0 && i < int64(c.min):
		d.failf(path, n, "%d must be at least %d", i, c.min)
		return 0, false
	case c.signed && (i < math.MinInt32 || i > math.MaxInt32):
		// The same range the run API takes for a run's own priority.
		d.failf(path, n, "%d is outside [%d, %d]", i, math.MinInt32, math.MaxInt32)
		return 0, false
	case i > math.MaxInt32:
		// Counts, rates and sizes above 2^31 are typos, and keeping them
		// small keeps the governors' arithmetic far from overflow.
		d.failf(path, n, "%d is too large (at most %d)", i, math.MaxInt32)
		return 0, false
	}
	return i, true
}

// float decodes a number (integer or decimal literal), finite and
// non-negative, within [0,1] for ratios.
func (d *decoder) float(path string, n *yaml.Node, c checks) (float64, bool) {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != tagInt && n.ShortTag() != tagFloat) {
		d.typeErr(path, n, "a number")
		return 0, false
	}
	var f float64
	if err := n.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		d.failf(path, n, "%s is not a finite number", n.Value)
		return 0, false
	}
	switch {
	case c.ratio && (f < 0 || f > 1):
		d.failf(path, n, "%s is outside [0,1]", n.Value)
		return 0, false
	case c.positive && f <= 0:
		d.failf(path, n, "%s must be greater than 0", n.Value)
		return 0, false
	case f < 0:
		d.failf(path, n, "%s must not be negative", n.Value)
		return 0, false
	}
	return f, true
}

// duration decodes a Go duration string. Bare numbers other than 0 are
// refused: "30" could mean seconds or milliseconds depending on who wrote it.
func (d *decoder) duration(path string, n *yaml.Node, v reflect.Value, c checks) {
	if n.Kind != yaml.ScalarNode {
		d.typeErr(path, n, "a duration such as 30s")
		return
	}
	var dur time.Duration
	switch n.ShortTag() {
	case tagStr:
		var err error
		if dur, err = time.ParseDuration(n.Value); err != nil {
			if _, numErr := strconv.ParseFloat(n.Value, 64); numErr == nil {
				d.failf(path, n, "%q has no unit; write a Go duration such as %ss or %sms", n.Value, n.Value, n.Value)
			} else {
				d.failf(path, n, "%q is not a duration (write a Go duration such as 250ms, 30s or 5m)", n.Value)
			}
			return
		}
	case tagInt, tagFloat:
		// A bare 0 is unambiguous (and Go's own ParseDuration accepts it);
		// any other bare number leaves the unit to guesswork.
		var f float64
		if err := n.Decode(&f); err != nil || f != 0 {
			d.failf(path, n, "%s has no unit; write a Go duration such as %ss or %sms", n.Value, n.Value, n.Value)
			return
		}
	default:
		d.typeErr(path, n, "a duration such as 30s")
		return
	}
	switch {
	case dur < 0:
		d.failf(path, n, "%s must not be negative", n.Value)
		return
	case c.positive && dur == 0:
		d.failf(path, n, "%s must be greater than 0", n.Value)
		return
	}
	v.SetInt(int64(dur))
}

// text decodes a string. Numbers are taken as their text (a descriptor value
// of 200 means "200"); booleans are not, since `value: yes`-style surprises
// are exactly what a strict decoder is for.
func (d *decoder) text(path string, n *yaml.Node, c checks) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		d.typeErr(path, n, "a string")
		return "", false
	}
	switch n.ShortTag() {
	case tagStr, tagInt, tagFloat, tagTimestamp:
	default:
		d.typeErr(path, n, "a string")
		return "", false
	}
	if msg := c.checkString(n.Value); msg != "" {
		d.failf(path, n, "%s", msg)
		return "", false
	}
	return n.Value, true
}

// decimal is the value of an untagged plain integer written in decimal
// without a leading zero ("500", "-1"), which is what yaml.v3 makes of it
// too; ok is false for anything else (0x1F, 0o17, 1_000, an explicit tag),
// left to yaml.v3. yaml.v3's Node.Decode costs a decoder of its own each
// time, and a file can hold a hundred thousand integers.
func decimal(n *yaml.Node) (int64, bool) {
	s := n.Value
	if n.Style != 0 || s == "" {
		return 0, false
	}
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || digits[0] == '0' && len(digits) > 1 {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	i, err := strconv.ParseInt(s, 10, 64)
	return i, err == nil
}

func (d *decoder) typeErr(path string, n *yaml.Node, want string) {
	d.markBad(path)
	if at := d.pos(n); d.listed(at) {
		d.found.add(at, path, "expected %s, got %s", []any{want, describe(n)})
	}
}

// describe names what a node holds, for type errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "..."
	}
	switch n.ShortTag() {
	case tagStr:
		return "string " + strconv.Quote(v)
	case tagInt:
		return "integer " + v
	case tagFloat:
		return "number " + v
	case tagBool:
		return "boolean " + v
	case tagNull:
		return "nothing"
	case tagTimestamp:
		return "timestamp " + v
	}
	return fmt.Sprintf("%s value %q", n.ShortTag(), v)
}

func validWindow(i int64) bool {
	switch Window(i) {
	case WindowSecond, WindowMinute, WindowHour, WindowDay:
		return true
	}
	return false
}
