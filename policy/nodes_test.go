package policy

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// yamlNodes is how many nodes yaml.v3 builds for data the way Parse reads
// it (the document, then a second one if there is one), and whether it
// parsed. A failed parse builds nodes too, which no API shows.
func yamlNodes(data []byte) (n int, ok bool) {
	defer func() {
		if recover() != nil {
			n, ok = 0, false
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for range 2 {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			return n, err.Error() == "EOF"
		}
		n += countNodes(&doc)
	}
	return n, true
}

func countNodes(n *yaml.Node) int {
	c := 1
	for _, k := range n.Content {
		c += countNodes(k)
	}
	return c
}

// checkBound fails the test when nodeBound(data) is below what yaml.v3
// builds; it reports whether yaml.v3 parsed data.
func checkBound(t *testing.T, data []byte) bool {
	t.Helper()
	n, ok := yamlNodes(data)
	if b := nodeBound(data); ok && b < n {
		t.Fatalf("nodeBound = %d, yaml.v3 builds %d nodes for %q", b, n, data)
	}
	return ok
}

// shapes are YAML files at the limit, one per way of packing nodes: what
// the bound must cover and what it refuses.
var shapes = []struct {
	name string
	file func(size int) []byte
}{
	{"tenant overrides", func(size int) []byte {
		return upTo(size, tenantsHead, "    t%06d: { rate: 500, window: 1 }\n")
	}},
	{"tenant overrides, block", func(size int) []byte {
		return upTo(size, tenantsHead, "    t%06d:\n      rate: 500\n      window: 1\n")
	}},
	{"tenant overrides with errors", func(size int) []byte {
		return upTo(size, tenantsHead, "    t%06d: {rate: -1, window: 7, x: 1}\n")
	}},
	{"flow list of scalars", func(size int) []byte { return fill(size, "version: 1\ntargets: [", "0", ",", "]\n") }},
	{"block list of scalars", func(size int) []byte { return fill(size, "version: 1\ntargets:\n", "- 0\n", "", "") }},
	{"flow list of lists", func(size int) []byte { return fill(size, "version: 1\ntargets: [", "[]", ",", "]\n") }},
	{"flow list of mappings", func(size int) []byte { return fill(size, "version: 1\ntargets: [", "{}", ",", "]\n") }},
	{"flow list of pairs", func(size int) []byte { return fill(size, "version: 1\ntargets: [", "a: 0", ", ", "]\n") }},
	{"flow mapping of keys", func(size int) []byte { return fill(size, "version: 1\npools: {", "a", ",", "}\n") }},
	{"block mapping", func(size int) []byte { return upTo(size, "version: 1\npools:\n", "  p%d: 0\n") }},
	{"empty values", func(size int) []byte { return upTo(size, "version: 1\npools:\n", "  p%d:\n") }},
	{"empty list entries", func(size int) []byte { return fill(size, "version: 1\ntargets:\n", "-\n", "", "") }},
	{"nested lists", func(size int) []byte {
		depth := min(size/2, 9_990)
		return []byte("version: 1\ntargets: " + strings.Repeat("[", depth) + strings.Repeat("]", depth) + "\n")
	}},
	{"one long scalar", func(size int) []byte {
		return []byte("version: 1\nshutdown_grace: " + strings.Repeat("a", size-40) + "\n")
	}},
	{"aliases", func(size int) []byte {
		return upTo(size, tenantsHead+"    t: &a { rate: 500, window: 1 }\n", "    u%06d: *a\n")
	}},
	// What costs the decoder most per node: a struct, paths and
	// validation for every two or three nodes.
	{"targets named in pairs", func(size int) []byte { return closed(size, "version: 1\ntargets: [", "name: a%d, ") }},
	{"bridges named in pairs", func(size int) []byte { return closed(size, "version: 1\nbridges: [", "name: b%d, ") }},
	{"rls entries in pairs", func(size int) []byte {
		return closed(size, "version: 1\nrls:\n  listen: ':1'\n  domains:\n    d: [", "key: a%d, ")
	}},
	{"run definitions", func(size int) []byte {
		return upTo(size, "version: 1\ningress: {listen: ':1', worker: 'http://w'}\nscheduler:\n  definitions:\n", "    d%d: {}\n")
	}},
	{"pools", func(size int) []byte { return upTo(size, "version: 1\npools:\n", "  p%d: {concurrency: 1}\n") }},
	{"hosts of a target", func(size int) []byte {
		return closed(size, "version: 1\ntargets:\n- name: a\n  hosts: [", "h%d, ")
	}},
	{"pools of a target", func(size int) []byte {
		return closed(size, "version: 1\ntargets:\n- name: a\n  hosts: [h]\n  pools: [", "p%d, ")
	}},
}

const tenantsHead = "version: 1\ningress:\n  listen: 127.0.0.1:8080\n  worker: http://127.0.0.1:9000\n  tenant: { header: x-tenant-id, rate: 100, window: 1 }\n  tenants:\n"

// upTo is head, then format filled with 0, 1, 2... while the file stays
// within size bytes.
func upTo(size int, head, format string) []byte {
	b := []byte(head)
	for i := 0; ; i++ {
		next := fmt.Appendf(b, format, i)
		if len(next) > size {
			return b
		}
		b = next
	}
}

// closed is upTo(size, head, format) as a flow list: ending in "z]".
func closed(size int, head, format string) []byte {
	return append(upTo(size-3, head, format), "z]\n"...)
}

// atCap is the longest file of shape whose node bound is within maxNodes.
func atCap(file func(size int) []byte) []byte {
	lo, hi := 1, maxFileSize
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if nodeBound(file(mid)) <= maxNodes {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return file(lo)
}

// fill is head, item as many times as fit in size bytes (joined by sep),
// then tail.
func fill(size int, head, item, sep, tail string) []byte {
	n := (size - len(head) - len(tail) + len(sep)) / (len(item) + len(sep))
	return []byte(head + strings.Repeat(item+sep, n-1) + item + tail)
}

// yamlCorners are constructs at the edges of the bound's argument.
var yamlCorners = []string{
	"[a,\tb: c,\t? d]", "? [a]: b", "%YAML 1.1\n---\na: 1\n...\n", "a: |2-\n   x\n  y\nb: >\n z\n",
	"&a [x, y]: *a", "!t", "{? a}", "[? a: b]", "{a: , b}", "[a: , b: ]", "{a:}", "[a:]", "[:]",
	"- ? a\n  : b\n- ? \n  :\n", "? a\n: b: c\n", "- - - a: 1\n    b: 2\n", "a:\n- b\n- c:\n  - d\n",
	"k: [\n a,\n b: c,\n]\n", "{ a: [b, {c: d}], e }", "[{a: b}: c, [d]: e]", "[\"a\":b, 'c':d]",
	"a: b\n# {[\nc: [d, e]\n", "a: 'x\n  [y'\nb: [c: d]\n", "- !t\n- &a\n- *a\n", "--- |\n x\n--- >\n y\n",
	"[a\n, b\n]", "{a\n: b}", "a:\n  - b\n  -\n  - c\n", "? - a\n  - b\n: - c\n", "- a: b\n  c: d\n- e\n",
	"a: !!map {b: c}", "a: !t[x] [y, z]", "a: !t{ {b}", "[*a]", "&a x: *a", "{*a : b}", "[&a : b]",
	"a: {b: c}\r\nd: [e]\r\n", "\ufeffa: [b, c]", "a:\u0085- b\u0085- c", "\xff\xfea\x00:\x00 \x00[\x00b\x00]\x00",
	"---\n---\n---\n", "a: 'b' # c: [d\ne: {f, g}\n", "[a, !t, b]", "{a: !t, b}",
}

// The bound covers what yaml.v3 builds for the example policy, every case
// of the decoder's tests, the corner cases and every shape, at sizes from a
// few bytes to 100 KB.
func TestNodeBoundCoversYAML(t *testing.T) {
	example, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	srcs := [][]byte{example}
	for _, tc := range errorCases {
		srcs = append(srcs, []byte(tc.src))
	}
	for _, c := range yamlCorners {
		srcs = append(srcs, []byte(c))
	}
	for _, sh := range shapes {
		for _, size := range []int{64, 1000, 100_000} { // maxFileSize: TestNodeBoundOfShapes
			srcs = append(srcs, sh.file(size))
		}
	}
	for _, src := range srcs {
		checkBound(t, src)
	}
}

// The bound covers what yaml.v3 builds for every shape at the limit, and
// is tight: 1 MiB of valid tenant overrides stays well under maxNodes, and
// no shape is bounded at more than 5 times what yaml.v3 builds.
func TestNodeBoundOfShapes(t *testing.T) {
	for _, sh := range shapes {
		data := sh.file(maxFileSize)
		n, ok := yamlNodes(data)
		b := nodeBound(data)
		if !ok || b < n {
			t.Fatalf("%s: parsed %v, %d nodes, bound %d", sh.name, ok, n, b)
		}
		t.Logf("%-30s %8d nodes, bound %8d (%.2f)", sh.name, n, b, float64(b)/float64(n))
		if b > 5*n+8 {
			t.Errorf("%s: bound %d for %d nodes", sh.name, b, n)
		}
		if (sh.name == "tenant overrides" || sh.name == "tenant overrides, block") && b > maxNodes*7/10 {
			t.Errorf("%s: bound %d at the limit, want well under %d", sh.name, b, maxNodes)
		}
	}
}

// yamlGen writes random YAML from the constructs the bound reasons about:
// block and flow collections, pairs in flow lists, keys without values,
// empty values and entries, explicit keys, anchors, aliases, tags,
// comments, and quoted and plain scalars holding indicators.
type yamlGen struct {
	r *rand.Rand
	b strings.Builder
}

var genScalars = []string{
	"a", "0", "x y", "a:b", "a#b", "it's", "-1", "?x", "http://h/p?q=1", "a,b",
	`"q"`, `"a: [b, {c"`, `'s'`, `'it''s ] }'`, `"\"["`, "~", "null", "",
	"&n a", "*n", "!t x", "!!str y", "!t[,] z", "&m", "!u", "10:30", "a-b",
	"-", "a->b", `"a":`, "x}", "y]", "--- x", "a # c", `"x" `, "\u2028",
}

func (g *yamlGen) scalar(flow bool) string {
	for {
		s := genScalars[g.r.IntN(len(genScalars))]
		if flow && strings.ContainsAny(s, ",") && s[0] != '"' && s[0] != '\'' {
			continue
		}
		return s
	}
}

func (g *yamlGen) pad() string { return [...]string{"", " ", "  "}[g.r.IntN(3)] }

func (g *yamlGen) flow(depth int) string {
	if depth <= 0 || g.r.IntN(3) == 0 {
		return g.scalar(true)
	}
	n := g.r.IntN(4)
	var parts []string
	list := g.r.IntN(2) == 0
	for range n {
		switch g.r.IntN(7) {
		case 0:
			parts = append(parts, g.flow(depth-1)+":"+g.pad()+" "+g.flow(depth-1))
		case 6:
			parts = append(parts, `"k":`+g.flow(depth-1)) // JSON style
		case 1:
			parts = append(parts, g.flow(depth-1)+":")
		case 2:
			parts = append(parts, "? "+g.flow(depth-1))
		case 3:
			parts = append(parts, g.flow(depth-1)+g.pad()+"#c]{\n")
		default:
			parts = append(parts, g.flow(depth-1))
		}
	}
	sep := "," + g.pad()
	if g.r.IntN(4) == 0 {
		sep = ",\n  "
	}
	if list {
		return "[" + g.pad() + strings.Join(parts, sep) + g.pad() + "]"
	}
	return "{" + g.pad() + strings.Join(parts, sep) + g.pad() + "}"
}

func (g *yamlGen) block(indent string, depth int) {
	n := 1 + g.r.IntN(3)
	list := g.r.IntN(2) == 0
	for i := range n {
		g.b.WriteString(indent)
		if list {
			g.b.WriteString("-")
		} else {
			if g.r.IntN(8) == 0 {
				g.b.WriteString("? " + g.scalar(false) + "\n" + indent + ":")
			} else {
				fmt.Fprintf(&g.b, "k%d%s:", i, g.pad())
			}
		}
		switch k := g.r.IntN(7); {
		case k == 0 || depth <= 0:
			g.b.WriteString("\n") // empty value or entry
		case k == 1:
			g.b.WriteString(" " + g.scalar(false) + "\n")
		case k == 2:
			g.b.WriteString(" " + g.flow(depth-1) + "\n")
		case k == 3:
			g.b.WriteString(" |\n" + indent + "  [a, {b: c}, d\n")
		case k == 4:
			g.b.WriteString(" # [{\n")
			g.block(indent+"  ", depth-1)
		case k == 5 && list:
			g.b.WriteString(" ")
			g.block(indent+"  ", depth-1) // compact: "- k0: ..." / "- - ..."
		default:
			g.b.WriteString("\n")
			g.block(indent+"  ", depth-1)
		}
	}
}

// generate is one random document, then sometimes a second one.
func (g *yamlGen) generate() []byte {
	g.b.Reset()
	if g.r.IntN(4) == 0 {
		g.b.WriteString(g.flow(4) + "\n")
	} else {
		g.block("", 4)
	}
	if g.r.IntN(8) == 0 {
		g.b.WriteString("---\n")
		g.block("", 2)
	}
	s := g.b.String()
	switch g.r.IntN(8) {
	case 0:
		s = strings.ReplaceAll(s, "\n", "\r\n")
	case 1:
		s = "\uFEFF" + s
	case 2:
		s = strings.ReplaceAll(s, "\n", "\u0085")
	}
	return []byte(s)
}

// The bound covers what yaml.v3 builds for random YAML of every construct
// it reasons about; most of the generated files parse.
func TestNodeBoundOfRandomYAML(t *testing.T) {
	g := &yamlGen{r: rand.New(rand.NewPCG(1, 2))}
	parsed := 0
	const n = 20_000
	for range n {
		if checkBound(t, g.generate()) {
			parsed++
		}
	}
	if parsed < n/4 {
		t.Fatalf("only %d of %d generated files parse", parsed, n)
	}
	t.Logf("%d of %d parsed", parsed, n)
}

// FuzzNodeBound: whatever the bytes, when yaml.v3 parses them it builds no
// more nodes than nodeBound says.
func FuzzNodeBound(f *testing.F) {
	g := &yamlGen{r: rand.New(rand.NewPCG(3, 4))}
	for range 200 {
		f.Add(g.generate())
	}
	for _, tc := range errorCases {
		f.Add([]byte(tc.src))
	}
	for _, c := range yamlCorners {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkBound(t, data) })
}

// A file whose bound is over maxNodes is refused with one error, before
// yaml.v3 builds anything: it allocates next to nothing.
func TestNodeCapRefusesWithoutParsing(t *testing.T) {
	refused := 0
	for _, sh := range shapes {
		data := sh.file(maxFileSize)
		b := nodeBound(data)
		if b <= maxNodes {
			continue
		}
		refused++
		var err error
		if got := allocatedBy(func() { _, err = Parse("t.yaml", data) }); got > 64<<10 {
			t.Errorf("%s: refusing it allocated %d KiB", sh.name, got>>10)
		}
		want := fmt.Sprintf("t.yaml:1:1: the file has up to %d YAML values (keys, values, lists and mappings), more than the %d a policy file may hold; it was not parsed", b, maxNodes)
		if err == nil || err.Error() != want {
			t.Errorf("%s: got %.300v\nwant %s", sh.name, err, want)
		}
	}
	if refused < 5 {
		t.Fatalf("only %d shapes at the limit are over the node bound", refused)
	}
}

// Parsing a file at the limit of each shape, or the largest one under the
// node bound, allocates at most 112 MiB, YAML tree included (the decoder
// before the bound allocated 124-270 MiB for several of them, 546 MiB for
// a list of 0s at 1 MiB).
func TestParseAllocationIsBounded(t *testing.T) {
	if raceDetector {
		t.Skip("under -race, sync.Pool drops what regexp reuses: every host check allocates a matcher")
	}
	for _, sh := range shapes {
		data := atCap(sh.file)
		if got := allocatedBy(func() { _, _ = Parse("t.yaml", data) }); got > 112<<20 {
			t.Errorf("%s (%d bytes): Parse allocated %d MiB", sh.name, len(data), got>>20)
		}
	}
}
