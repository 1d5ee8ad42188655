package policy

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const examplePath = "../policies.example.yaml"

// The example is the file `make run` uses and the one operators copy from:
// it must load cleanly and keep exercising the whole format.
func TestExamplePolicy(t *testing.T) {
	p, err := Load(examplePath)
	if err != nil {
		t.Fatalf("example policy does not load:\n%v", err)
	}
	if len(p.Warnings) != 0 {
		t.Errorf("example policy has warnings: %v", p.Warnings)
	}
	// The addresses SPEC §3 and the Makefile rely on.
	checks := map[string]string{
		"admin.listen":        p.Admin.Listen,
		"ingress.listen":      p.Ingress.Listen,
		"ingress.worker":      p.Ingress.Worker,
		"egress.http_listen":  p.Egress.HTTPListen,
		"egress.grpc_listen":  p.Egress.GRPCListen,
		"bridges[0].name":     p.Bridges[0].Name,
		"bridges[0].listen":   p.Bridges[0].Listen,
		"bridges[0].upstream": p.Bridges[0].Upstream,
		"bridges[0].protocol": p.Bridges[0].Protocol,
		"rls.listen":          p.RLS.Listen,
		"scheduler.store":     p.Scheduler.Store.Kind,
		"backend.kind":        p.Backend.Kind,
	}
	want := map[string]string{
		"admin.listen":        "127.0.0.1:9901",
		"ingress.listen":      "0.0.0.0:8080",
		"ingress.worker":      "http://127.0.0.1:9000",
		"egress.http_listen":  "127.0.0.1:15001",
		"egress.grpc_listen":  "127.0.0.1:15002",
		"bridges[0].name":     "orders-db",
		"bridges[0].listen":   "127.0.0.1:15432",
		"bridges[0].upstream": "127.0.0.1:5432",
		"bridges[0].protocol": "postgres",
		"rls.listen":          "127.0.0.1:8081",
		"scheduler.store":     "bbolt",
		"backend.kind":        "memory",
	}
	for k, w := range want {
		if checks[k] != w {
			t.Errorf("%s = %q, want %q", k, checks[k], w)
		}
	}
}

// TestExampleUsesEveryKey fails when a key is added to the schema without
// being shown in the example (set, or at least in a comment).
func TestExampleUsesEveryKey(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				used[n.Content[i].Value] = true
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&root)

	seen := map[reflect.Type]bool{}
	var visit func(t reflect.Type)
	visit = func(rt reflect.Type) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice || rt.Kind() == reflect.Map {
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct || seen[rt] || rt == positionType || rt.PkgPath() != reflect.TypeFor[Policy]().PkgPath() {
			return
		}
		seen[rt] = true
		for _, f := range schemaOf(rt).fields {
			// Keys that only apply to a non-default kind (backend.url) may
			// be shown in a comment instead.
			if !used[f.name] && !strings.Contains(string(data), f.name+":") {
				t.Errorf("%s.%s (%q) is not used in %s", rt.Name(), rt.Field(f.index).Name, f.name, examplePath)
			}
			visit(rt.Field(f.index).Type)
		}
	}
	visit(reflect.TypeFor[Policy]())
}
