package scheduler

import (
	"fmt"
	"regexp"
	"strings"
)

// keyExpr is a compiled definition key: literal text around ${input.<path>}
// and ${header.<name>} placeholders, e.g. "tenant-${input.account.id}". It
// is resolved once per run, at submit, from the run's input and the submit
// request's headers.
type keyExpr struct {
	src   string
	parts []keyPart
}

type keyPart struct {
	lit    string   // literal text, when path and header are empty
	path   []string // ${input.a.b}
	header string   // ${header.x-tenant-id}
}

var (
	inputPathRE  = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)
	headerNameRE = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
)

// compileKey parses a key expression with the policy's rules (text with at
// least one ${input.<path>} or ${header.<name>} placeholder). The empty
// expression compiles to nil: the definition has no key.
func compileKey(s string) (*keyExpr, error) {
	if s == "" {
		return nil, nil
	}
	k := &keyExpr{src: s}
	rest := s
	for {
		i := strings.Index(rest, "${")
		if i < 0 {
			break
		}
		if i > 0 {
			k.parts = append(k.parts, keyPart{lit: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("key %q has an unterminated ${", s)
		}
		expr := rest[i+2 : i+j]
		src, arg, _ := strings.Cut(expr, ".")
		switch {
		case src == "input" && inputPathRE.MatchString(arg):
			k.parts = append(k.parts, keyPart{path: strings.Split(arg, ".")})
		case src == "header" && headerNameRE.MatchString(arg):
			k.parts = append(k.parts, keyPart{header: arg})
		default:
			return nil, fmt.Errorf("key %q: placeholder ${%s} must be ${input.<path>} or ${header.<name>}", s, expr)
		}
		rest = rest[i+j+1:]
	}
	if rest != "" {
		k.parts = append(k.parts, keyPart{lit: rest})
	}
	for _, p := range k.parts {
		if p.path != nil || p.header != "" {
			return k, nil
		}
	}
	return nil, fmt.Errorf("key %q has no ${input.<path>} or ${header.<name>} placeholder", s)
}

// resolve computes the run's key. A placeholder that resolves to nothing
// (a missing field, JSON null, an absent or empty header) makes the whole key
// the expression itself, so unkeyed runs share one bucket named by it
// rather than escape the limit (SPEC §6).
func (k *keyExpr) resolve(input []byte, header func(name string) []byte) string {
	if k == nil {
		return ""
	}
	if len(k.parts) == 1 {
		v, ok := k.value(k.parts[0], input, header)
		if !ok {
			return k.src
		}
		return v
	}
	var b strings.Builder
	for _, p := range k.parts {
		v, ok := k.value(p, input, header)
		if !ok {
			return k.src
		}
		b.WriteString(v)
	}
	return b.String()
}

func (k *keyExpr) value(p keyPart, input []byte, header func(string) []byte) (string, bool) {
	switch {
	case p.path != nil:
		return lookupJSON(input, p.path)
	case p.header != "":
		if header == nil {
			return "", false
		}
		v := header(p.header)
		if len(v) == 0 {
			return "", false
		}
		return string(v), true
	}
	return p.lit, true
}
