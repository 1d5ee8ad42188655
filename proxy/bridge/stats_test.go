package bridge

import (
	"context"
	"testing"

	"github.com/warden-dev/warden/governor/clock"
)

// The gauges are computed from the sessions when /metrics is gathered.
func TestGaugesAtGather(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("gauges"))
	idle := h.connect("gauges", "idle")
	if _, err := idle.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	busy := h.connect("gauges", "busy")
	if _, err := busy.Exec(context.Background(), "BEGIN"); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	mfs, err := h.m.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := mf.GetName()
			for _, l := range m.GetLabel() {
				labels += "," + l.GetName() + "=" + l.GetValue()
			}
			if m.GetGauge() != nil {
				got[labels] = m.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{
		"warden_bridge_connections,bridge=gauges,state=idle":   1,
		"warden_bridge_connections,bridge=gauges,state=in_use": 1,
		"warden_bridge_waiting,bridge=gauges":                  0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}
