package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// proc is a child process the harness started. Every one is stopped by its
// PID: by the scenario that started it, or by the harness's sweep after the
// scenario, whichever comes first.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has been reaped
	log  *os.File
}

// procs is the set of children still running, swept after each scenario.
type procs struct {
	mu  sync.Mutex
	all map[*proc]struct{}
}

// spawn is what starting a child needs: its name (for messages), where its
// output goes (appended), its environment additions, working directory and
// process attributes.
type spawn struct {
	name    string
	logPath string
	env     []string
	dir     string
	attr    *syscall.SysProcAttr
	stdin   *os.File
	stdout  *os.File // default: the log
	bin     string
	args    []string
}

func (ps *procs) start(s spawn) (*proc, error) {
	log, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: log: %w", s.name, err)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = log, log
	if s.stdout != nil {
		cmd.Stdout = s.stdout
	}
	if s.stdin != nil {
		cmd.Stdin = s.stdin
	}
	attr := s.attr
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	// A child outlives nothing: if the harness dies, so does it.
	if attr.Pdeathsig == 0 {
		attr.Pdeathsig = syscall.SIGKILL
	}
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", s.name, err)
	}
	p := &proc{name: s.name, cmd: cmd, done: make(chan struct{}), log: log}
	ps.mu.Lock()
	if ps.all == nil {
		ps.all = map[*proc]struct{}{}
	}
	ps.all[p] = struct{}{}
	ps.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		log.Close()
		ps.mu.Lock()
		delete(ps.all, p)
		ps.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the process by its PID and waits up to grace for it to
// exit, then kills it (SIGKILL) and waits for that.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// kill is kill -9 by PID, waiting until the process is reaped.
func (p *proc) kill() { p.stop(syscall.SIGKILL, time.Minute) }

// sweep stops every child still running (SIGTERM, then SIGKILL after
// grace) and says which ones it had to stop.
func (ps *procs) sweep(grace time.Duration) []string {
	ps.mu.Lock()
	var left []*proc
	for p := range ps.all {
		left = append(left, p)
	}
	ps.mu.Unlock()
	var names []string
	for _, p := range left {
		names = append(names, fmt.Sprintf("%s (pid %d)", p.name, p.pid()))
		p.stop(syscall.SIGTERM, grace)
	}
	return names
}

// freePorts returns n loopback addresses nothing listened on a moment ago.
func freePorts(n int) ([]string, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// rlimitExec is the subcommand `rlimit-exec N BIN ARGS...`: it sets its own
// RLIMIT_NOFILE to N (soft and hard) and becomes BIN, keeping its PID, so
// that a child starts with a lowered file limit without touching the
// harness's own or anything system-wide.
func rlimitExec(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: rlimit-exec N BIN ARGS...")
	}
	n, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil {
		return fmt.Errorf("rlimit-exec: %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
		return fmt.Errorf("rlimit-exec: setrlimit: %w", err)
	}
	bin, err := exec.LookPath(args[1])
	if err != nil {
		return err
	}
	return unix.Exec(bin, args[1:], os.Environ())
}
