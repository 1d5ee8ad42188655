package app

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warden-dev/warden/governor"
)

// notReady is a component whose Ready fails with err (nil: ready).
type notReady struct {
	name string
	err  error
}

func (c notReady) Name() string                                  { return c.name }
func (notReady) Apply(context.Context, *governor.Controls) error { return nil }
func (notReady) Shutdown(context.Context) error                  { return nil }
func (c notReady) Ready() error                                  { return c.err }

// TestReadyNamesEveryComponentDown: a file-descriptor flood stops the
// ingress and the egress together; /readyz must name both, not only the
// first it asks (the chaos harness's fd-exhaustion scenario caught an
// egress not accepting while /readyz named only the ingress).
func TestReadyNamesEveryComponentDown(t *testing.T) {
	started := make(chan struct{})
	close(started)
	a := &App{started: started, components: []Component{
		notReady{"ingress", errors.New("listener 127.0.0.1:8080 not accepting: accept4: too many open files")},
		notReady{"scheduler", nil},
		notReady{"egress", errors.New("listener 127.0.0.1:15001 not accepting: accept4: too many open files")},
	}}
	err := a.ready()
	if err == nil {
		t.Fatal("ready with two listeners down")
	}
	for _, want := range []string{"ingress: listener 127.0.0.1:8080", "egress: listener 127.0.0.1:15001"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ready() = %q, want it to name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "scheduler") {
		t.Errorf("ready() = %q names a component that is ready", err)
	}
}
