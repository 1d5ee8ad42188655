package policy

import (
	"reflect"

	"gopkg.in/yaml.v3"
)

// pair is one key: value entry of a mapping; aliased marks one merged in
// through an alias (<<: *base), which counts towards maxAliasValues.
type pair struct {
	k, v    *yaml.Node
	aliased bool
}

// decodePair decodes the value of kv, found at path, into v.
func (d *decoder) decodePair(path string, kv pair, v reflect.Value, c checks) {
	if kv.aliased {
		d.aliased++
		defer func() { d.aliased-- }()
	}
	d.decode(path, kv.v, v, c)
}

// pairs lists the entries of mapping n in file order, reporting duplicate
// and non-string keys, and expanding merge keys (<<: *base) the YAML way:
// keys written in the mapping win over merged ones, earlier merges over
// later ones.
func (d *decoder) pairs(path string, n *yaml.Node) []pair {
	own := map[string]*yaml.Node{}
	// A mapping may have one << like any other key: yaml.v3 would keep the
	// first of two, silently dropping what the second one merges.
	var merge *yaml.Node // the first <<, the one that merges
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := resolve(n.Content[i])
		// Keys are counted too: an aliased mapping of unknown keys
		// decodes no value, but reports every key each time.
		if !d.step(path, k) {
			return nil
		}
		if isMerge(k) {
			if merge != nil {
				d.addf(d.pos(k), "duplicate key %q %s (first at line %d); merge several mappings with one: <<: [*a, *b]", k.Value, where(path), merge.Line)
				continue
			}
			merge = k
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.pathf(d.pos(k), path, "keys must be strings, got %s", describe(k))
			continue
		}
		if first, dup := own[k.Value]; dup {
			d.addf(d.pos(k), "duplicate key %q %s (first at line %d)", k.Value, where(path), first.Line)
			continue
		}
		own[k.Value] = k
	}
	out := make([]pair, 0, len(own))
	merged := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if isMerge(k) {
			if k != merge {
				continue
			}
			for _, m := range d.mergeSources(path, v) {
				if own[m.k.Value] == nil && !merged[m.k.Value] {
					merged[m.k.Value] = true
					out = append(out, m)
				}
			}
			continue
		}
		if k.Kind == yaml.ScalarNode && own[k.Value] == k {
			out = append(out, pair{k: k, v: v})
		}
	}
	return out
}

func isMerge(k *yaml.Node) bool { return k.Kind == yaml.ScalarNode && k.ShortTag() == tagMerge }

// mergeSources lists the pairs the value v of a << brings in. Pairs that
// come through an alias (<<: *base, <<: [*a, *b]) are marked aliased, as
// decoding them expands the alias.
func (d *decoder) mergeSources(path string, v *yaml.Node) (out []pair) {
	if v.Kind == yaml.AliasNode {
		d.aliased++
		defer func() {
			d.aliased--
			for i := range out {
				out[i].aliased = true
			}
		}()
	}
	v = resolve(v)
	if d.merges[v] {
		d.pathf(d.pos(v), path, "<< merges a mapping into itself")
		return nil
	}
	if !d.step(path, v) {
		return nil
	}
	d.merges[v] = true
	defer delete(d.merges, v)
	switch v.Kind {
	case yaml.MappingNode:
		return d.pairs(path, v)
	case yaml.SequenceNode:
		for _, item := range v.Content {
			if r := resolve(item); r.Kind != yaml.MappingNode {
				d.pathf(d.pos(r), path, "<< takes a mapping or a list of mappings, got %s", describe(r))
				continue
			}
			out = append(out, d.mergeSources(path, item)...)
		}
		return out
	}
	d.pathf(d.pos(v), path, "<< takes a mapping or a list of mappings, got %s", describe(v))
	return nil
}
