package store_test

import (
	"path/filepath"
	"testing"

	"github.com/warden-dev/warden/scheduler/store"
)

// BenchmarkBoltSubmitParallel measures durable submits with many
// concurrent callers sharing each fsync (run with -cpu and -benchtime).
func BenchmarkBoltSubmitParallel(b *testing.B) {
	s, err := store.OpenBolt(filepath.Join(b.TempDir(), "runs.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	input := []byte(`{"tenantId":"acme","order":12345}`)
	b.SetParallelism(256)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := &store.Run{Name: "tenant_sync", Status: store.Queued, Key: "acme", Input: input, CreatedAt: 1, QueuedAt: 1}
			if _, err := s.Submit(b.Context(), r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
