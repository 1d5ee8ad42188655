package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"reflect"
	"time"

	"gopkg.in/yaml.v3"
)

// maxAliasValues bounds how many keys and values one file may reach through
// aliases (*name, <<: *name). Aliases let a small file name the same subtree
// many times over ("billion laughs"), so what they expand to is not bounded
// by the file's size; what the file writes out is (maxNodes), and is not
// counted here. Honest files alias a breaker or a retry block, far below
// this.
const maxAliasValues = 200_000

// maxFileSize bounds the policy file itself, so that what a file writes
// out is bounded too: 1 MiB, the most a Kubernetes ConfigMap holds, which
// is how policies ship. What the file's size leaves open, how many nodes
// yaml.v3 builds from it, maxNodes bounds.
const maxFileSize = 1 << 20

// YAML core-schema tags as yaml.v3 reports them from Node.ShortTag.
const (
	tagStr       = "!!str"
	tagInt       = "!!int"
	tagFloat     = "!!float"
	tagBool      = "!!bool"
	tagNull      = "!!null"
	tagMerge     = "!!merge"
	tagTimestamp = "!!timestamp"
)

var (
	durationType = reflect.TypeFor[time.Duration]()
	windowType   = reflect.TypeFor[Window]()
	positionType = reflect.TypeFor[Position]()
)

// Load reads the policy file at path and parses it with Parse. A file that
// cannot be read yields an error naming the path; a file that does not
// validate yields Errors.
func Load(path string) (*Policy, error) {
	data, err := readLimited(path)
	if err != nil {
		// os errors already carry the path; unwrap so it is named once.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("policy: read %s: %w", path, err)
	}
	return Parse(path, data)
}

// readLimited reads path up to one byte past maxFileSize: enough for Parse
// to report a file too large, without reading all of one named by mistake.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxFileSize+1))
}

// Parse decodes, validates and completes the policy in data; file is the
// name used in positions. On any error it returns a nil policy and an
// Errors holding every problem in file order. The returned policy has every
// default filled in (see defaults.go) and must not be modified.
func Parse(file string, data []byte) (*Policy, error) {
	d := newDecoder(file)
	p := &Policy{}
	if len(data) > maxFileSize {
		d.addf(Position{File: file, Line: 1, Column: 1}, "the file is over %d bytes (%d MiB), the most a policy file may hold", maxFileSize, maxFileSize>>20)
	} else if n := nodeBound(data); n > maxNodes {
		d.addf(Position{File: file, Line: 1, Column: 1}, "the file has up to %d YAML values (keys, values, lists and mappings), more than the %d a policy file may hold; it was not parsed", n, maxNodes)
	} else if root := d.document(data); root != nil {
		d.decode("", root, reflect.ValueOf(p).Elem(), checks{})
		if !d.halted {
			validate(p, d)
			validateEffective(p, d)
		}
	}
	if errs := d.errors(); errs.Len() > 0 {
		return nil, errs
	}
	applyDefaults(p, d)
	p.buildIndexes()
	warn(p, d)
	sum := sha256.Sum256(data)
	p.Source = file
	p.Hash = hex.EncodeToString(sum[:])
	p.LoadedAt = time.Now()
	return p, nil
}

// buildIndexes fills the lookups behind PoolByName and TargetByName.
func (p *Policy) buildIndexes() {
	p.poolIndex = make(map[string]int, len(p.Pools))
	for i, pl := range p.Pools {
		p.poolIndex[pl.Name] = i
	}
	p.targetIdx = make(map[string]int, len(p.Targets))
	for i, t := range p.Targets {
		p.targetIdx[t.Name] = i
	}
	p.leaders = breakerLeaders(p.Targets)
}

// decoder walks yaml.v3 nodes into the schema structs, driven by their yaml
// and check tags. Besides the values it keeps, per key path, the nodes the
// file wrote there: validation needs them for positions, and defaults need
// them to tell "absent" from "explicitly zero" (jitter: 0, allow_unlisted:
// false).
type decoder struct {
	file   string
	found  firstIssues
	locs   map[string]loc      // path → where the file wrote it
	merges map[*yaml.Node]bool // mappings being merged (<<), to stop cycles
	// fileIndex maps, for a list that lost elements that were not
	// mappings, each decoded element to its index in the file.
	fileIndex map[string][]int
	scratch   []byte // for written
	// aliased is above zero while the walk is inside a subtree reached
	// through an alias; aliasValues counts what it decodes there.
	aliased     int
	aliasValues int
	// anchored is above zero while the walk is inside a node with an
	// anchor, which aliases may reach again.
	anchored int
	halted   bool
	schemas  map[reflect.Type]*schema
	unknown  map[*yaml.Node]bool // unknown keys reported
}

func newDecoder(file string) *decoder {
	return &decoder{
		file:      file,
		locs:      map[string]loc{},
		merges:    map[*yaml.Node]bool{},
		fileIndex: map[string][]int{},
		schemas:   map[reflect.Type]*schema{},
		unknown:   map[*yaml.Node]bool{},
	}
}

// schema is schemaOf(t), read once per Parse.
func (d *decoder) schema(t reflect.Type) *schema {
	s := d.schemas[t]
	if s == nil {
		v := schemaOf(t)
		s = &v
		d.schemas[t] = s
	}
	return s
}

// ---- walking ----

// step counts one more key or value reached through an alias and reports
// whether decoding may go on; past maxAliasValues it reports the file once
// and halts. What the file writes out is not counted: it is bounded by
// maxNodes and decoded once.
func (d *decoder) step(path string, n *yaml.Node) bool {
	if d.halted {
		return false
	}
	if d.aliased == 0 {
		return true
	}
	if d.aliasValues++; d.aliasValues > maxAliasValues {
		d.halted = true
		// Listed even past the first MaxErrors: it says why decoding
		// stopped, and so why nothing after it is reported.
		d.markBad(path)
		d.found.addListed(d.pos(n), path, "aliases expand to more than %d keys and values; write the file out with fewer aliases", []any{maxAliasValues})
		return false
	}
	return true
}

// decode stores the value of node n, found at path, into v.
func (d *decoder) decode(path string, n *yaml.Node, v reflect.Value, c checks) {
	if n.Kind == yaml.AliasNode {
		d.aliased++
		defer func() { d.aliased-- }()
	}
	if !d.step(path, n) {
		return
	}
	n = resolve(n)
	if n.Anchor != "" {
		d.anchored++
		defer func() { d.anchored-- }()
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == tagNull {
		d.failf(path, n, "has no value; give one or remove the key")
		return
	}
	switch v.Type() {
	case durationType:
		d.duration(path, n, v, c)
		return
	case windowType:
		if i, ok := d.integer(path, n, c); ok {
			if !validWindow(i) {
				d.failf(path, n, "%d is not one of 1, 60, 3600, 86400", i)
			}
			v.SetInt(i)
		}
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != tagBool {
			d.typeErr(path, n, "true or false")
			return
		}
		var b bool
		if err := n.Decode(&b); err != nil {
			d.typeErr(path, n, "true or false")
			return
		}
		v.SetBool(b)
	case reflect.Int:
		if i, ok := d.integer(path, n, c); ok {
			v.SetInt(i)
		}
	case reflect.Float64:
		if f, ok := d.float(path, n, c); ok {
			v.SetFloat(f)
		}
	case reflect.String:
		if s, ok := d.text(path, n, c); ok {
			v.SetString(s)
		}
	case reflect.Pointer:
		e := reflect.New(v.Type().Elem())
		d.decode(path, n, e.Elem(), c)
		v.Set(e)
	case reflect.Struct:
		d.structure(path, n, v)
	case reflect.Slice:
		d.list(path, n, v, c)
	case reflect.Map:
		d.dict(path, n, v, c)
	default:
		// A schema type the walker does not know is a bug in this package,
		// not in the file.
		panic("policy: no decoder for " + v.Type().String())
	}
}

// structure decodes a mapping into a struct, field by yaml tag.
func (d *decoder) structure(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.typeErr(path, n, "a mapping")
		return
	}
	s := d.schema(v.Type())
	seen := map[string]bool{}
	ps := release(d, n, d.pairs(path, n))
	for i, kv := range ps {
		ps[i] = pair{}
		name := kv.k.Value
		f, ok := s.byName[name]
		if !ok {
			// An aliased mapping is walked once per alias; its unknown
			// key is one mistake, written once. Only such a mapping
			// (anchored) can be walked again.
			if d.unknown[kv.k] {
				continue
			}
			if !d.mutable() {
				d.unknown[kv.k] = true
			}
			if at := d.pos(kv.k); d.listed(at) {
				d.addf(at, "unknown key %q %s%s", name, where(path), suggestion{name, s.names})
			}
			continue
		}
		p := child(path, name)
		d.record(p, kv.k, kv.v)
		seen[name] = true
		d.decodePair(p, kv, v.Field(f.index), f.checks)
	}
	if d.halted {
		return // keys past the alias bound were never read: none is missing
	}
	for _, f := range s.fields {
		if f.checks.required && !seen[f.name] {
			at := d.pos(n)
			if k := d.locs[path].key; k != (spot{}) {
				at = d.position(k)
			}
			if d.listed(at) {
				d.addf(at, "missing required key %q %s", f.name, where(path))
			}
		}
	}
}

// list decodes a sequence into a slice, or, for a slice of named structs
// (Pool), a mapping of name to settings in file order. An element that
// cannot hold its type is reported and left out (see fits).
func (d *decoder) list(path string, n *yaml.Node, v reflect.Value, c checks) {
	et := v.Type().Elem()
	if et.Kind() == reflect.Struct && d.schema(et).nameField >= 0 {
		d.namedList(path, n, v, c)
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.typeErr(path, n, "a list")
		return
	}
	kept := 0
	for _, item := range n.Content {
		if fits(item, et) {
			kept++
		}
	}
	out := reflect.MakeSlice(v.Type(), kept, kept)
	var fileIndex []int // made when an element is left out
	if kept < len(n.Content) {
		fileIndex = make([]int, 0, kept)
	}
	k := 0
	items := release(d, n, n.Content)
	for i, item := range items {
		if d.mutable() {
			items[i] = nil
		}
		p := index(path, i)
		if !fits(item, et) {
			d.unfit(p, item, et)
			continue
		}
		if fileIndex != nil {
			fileIndex = append(fileIndex, i)
		}
		e := out.Index(k)
		k++
		d.record(p, nil, item)
		d.decode(p, item, e, c.elem())
		d.setNamePos(e, "", d.pos(item))
	}
	if fileIndex != nil {
		d.fileIndex[path] = fileIndex
	}
	v.Set(out)
}

func (d *decoder) namedList(path string, n *yaml.Node, v reflect.Value, c checks) {
	if n.Kind != yaml.MappingNode {
		d.typeErr(path, n, "a mapping of name to settings")
		return
	}
	ps := release(d, n, d.pairs(path, n))
	et := v.Type().Elem()
	kept := fitting(ps, et)
	out := reflect.MakeSlice(v.Type(), kept, kept)
	// Every entry that fits has a place; one that does not is never
	// decoded, and is handed spare.
	spare := reflect.New(et).Elem()
	k := 0
	for i, kv := range ps {
		ps[i] = pair{}
		e := spare
		if k < out.Len() {
			e = out.Index(k)
		}
		if d.entry(path, kv, e, c) {
			k++
		} else {
			e.SetZero()
		}
	}
	v.Set(out.Slice(0, k))
}

func (d *decoder) dict(path string, n *yaml.Node, v reflect.Value, c checks) {
	if n.Kind != yaml.MappingNode {
		d.typeErr(path, n, "a mapping")
		return
	}
	ps := release(d, n, d.pairs(path, n))
	t := v.Type()
	out := reflect.MakeMapWithSize(t, fitting(ps, t.Elem()))
	// One element and one key, reused: the map keeps copies.
	e, key := reflect.New(t.Elem()).Elem(), reflect.New(t.Key()).Elem()
	for i, kv := range ps {
		ps[i] = pair{}
		e.SetZero()
		if d.entry(path, kv, e, c) {
			key.SetString(kv.k.Value)
			out.SetMapIndex(key, e)
		}
	}
	v.Set(out)
}

// entry decodes one name: value entry of a user-named mapping (pools,
// definitions, tenants, ...). It reports false for an entry with no name
// and for one whose value cannot hold its type (see fits): such an entry
// is recorded as written, so that references to it are not reported as
// undefined, but decodes to nothing.
func (d *decoder) entry(path string, kv pair, e reflect.Value, c checks) bool {
	name := kv.k.Value
	if name == "" {
		d.pathf(d.pos(kv.k), path, "empty name")
		return false
	}
	if t := kv.k.ShortTag(); t == tagBool || t == tagNull {
		// A name is a string: an unquoted true or ~ is YAML's boolean or
		// null, almost surely not the name meant.
		kind := "boolean"
		if t == tagNull {
			kind = "null"
		}
		d.pathf(d.pos(kv.k), path, "name %s is YAML's %s; quote it (%q) to use it as a name", name, kind, name)
		return false
	}
	p := child(path, name)
	d.record(p, kv.k, kv.v)
	if !fits(kv.v, e.Type()) {
		d.unfit(p, kv.v, e.Type())
		return false
	}
	d.decodePair(p, kv, e, c.elem())
	d.setNamePos(e, name, d.pos(kv.k))
	return true
}

// release cuts the children of node n out of the YAML tree, unless an
// alias may reach n again, and returns them: the caller drops each one once
// decoded, so that the tree, some 165 bytes a node, shrinks as the decoded
// policy grows instead of outliving it. Positions are kept in locs.
func release[T any](d *decoder, n *yaml.Node, children []T) []T {
	if d.mutable() {
		n.Content = nil
	}
	return children
}

// mutable reports whether the walk may cut what it has decoded out of the
// YAML tree: not inside a node with an anchor or reached through an alias.
func (d *decoder) mutable() bool { return d.aliased == 0 && d.anchored == 0 }

// fits reports whether node n, an element of a list or mapping of type t,
// has the kind t needs when t is a struct (a mapping) or a list (a list,
// or a mapping for a list of structs, as pools are written). A file can
// write a hundred thousand "0," or "x:" lines where a mapping belongs;
// each is reported, and left out rather than given a zero struct, which
// costs more than its YAML node.
func fits(n *yaml.Node, t reflect.Type) bool {
	n = resolve(n)
	switch t.Kind() {
	case reflect.Struct:
		return n.Kind == yaml.MappingNode
	case reflect.Slice:
		return n.Kind == yaml.SequenceNode || t.Elem().Kind() == reflect.Struct && n.Kind == yaml.MappingNode
	}
	return true
}

// fitting is how many of the entries ps fit (see fits) type t.
func fitting(ps []pair, t reflect.Type) int {
	k := 0
	for _, kv := range ps {
		if fits(kv.v, t) {
			k++
		}
	}
	return k
}

// unfit reports the element n at path that does not fit (see fits), as
// decode would. Nothing asks whether a left-out element was bad, so it is
// not marked so.
func (d *decoder) unfit(path string, n *yaml.Node, t reflect.Type) {
	if d.halted {
		return
	}
	n = resolve(n)
	at := d.pos(n)
	switch {
	case !d.listed(at):
	case n.Kind == yaml.ScalarNode && n.ShortTag() == tagNull:
		d.pathf(at, path, "has no value; give one or remove the key")
	case t.Kind() == reflect.Struct:
		d.pathf(at, path, "expected a mapping, got %s", describe(n))
	default:
		d.pathf(at, path, "expected a list, got %s", describe(n))
	}
}

// setNamePos fills the Name (when yaml:"-", i.e. taken from the mapping key)
// and Pos fields of a decoded struct.
func (d *decoder) setNamePos(v reflect.Value, name string, pos Position) {
	if v.Kind() != reflect.Struct {
		return
	}
	s := d.schema(v.Type())
	if s.nameField >= 0 && name != "" {
		v.Field(s.nameField).SetString(name)
	}
	if s.posField >= 0 {
		*v.Field(s.posField).Addr().Interface().(*Position) = pos
	}
}
