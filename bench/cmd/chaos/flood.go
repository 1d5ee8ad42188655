package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// floodMain is the subcommand `flood -addr A -n N`: a process of its own
// (with its own file limit) that opens N idle TCP connections to A, C at a
// time, prints "established K failed F", holds them until its standard
// input closes, then prints "closed M" (how many the server had closed
// meanwhile) and exits, closing them all.
func floodMain(args []string) error {
	fs := flag.NewFlagSet("flood", flag.ContinueOnError)
	addr := fs.String("addr", "", "host:port to connect to")
	n := fs.Int("n", 1000, "connections")
	c := fs.Int("c", 500, "connects in flight at once")
	timeout := fs.Duration("dial-timeout", time.Second, "per connect")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *addr == "" {
		return errors.New("-addr is required")
	}
	var mu sync.Mutex
	var conns []net.Conn
	failed := 0
	next := make(chan struct{})
	var wg sync.WaitGroup
	for range *c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: *timeout}
			for range next {
				conn, err := d.Dial("tcp", *addr)
				mu.Lock()
				if err != nil {
					failed++
				} else {
					conns = append(conns, conn)
				}
				mu.Unlock()
			}
		}()
	}
	for range *n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	fmt.Printf("established %d failed %d\n", len(conns), failed)
	_, _ = io.Copy(io.Discard, os.Stdin) // hold until the harness closes our input
	closed := 0
	for _, conn := range conns {
		if closedByPeer(conn) {
			closed++
		}
	}
	fmt.Printf("closed %d\n", closed)
	return nil
}

// closedByPeer peeks at the socket without waiting: an end of stream or an
// error means the server closed (or reset) the connection.
func closedByPeer(conn net.Conn) bool {
	sc, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	buf := make([]byte, 1)
	_ = sc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = n == 0 && err == nil || err != nil && err != unix.EAGAIN
		return true
	})
	return closed
}

// flooder is a running flood subprocess.
type flooder struct {
	p           *proc
	stdin       *os.File // closing it releases the flood
	lines       chan string
	established int
	failed      int
}

// startFlood starts a flood of n connections to addr and waits until they
// are all attempted.
func (s *scenario) startFlood(addr string, n int) (*flooder, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	p, err := s.env.procs.start(spawn{name: "flood " + addr, logPath: s.env.logDir + "/" + s.name + "-flood.log", stdin: inR, stdout: outW,
		bin: s.env.self, args: []string{"flood", "-addr", addr, "-n", strconv.Itoa(n), "-dial-timeout", "500ms"}})
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, err
	}
	f := &flooder{p: p, stdin: inW, lines: make(chan string, 4)}
	go func() {
		defer outR.Close()
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			f.lines <- sc.Text()
		}
		close(f.lines)
	}()
	select {
	case line, ok := <-f.lines:
		if !ok {
			return f, fmt.Errorf("flood to %s ended without a word", addr)
		}
		_, err := fmt.Sscanf(line, "established %d failed %d", &f.established, &f.failed)
		return f, err
	case <-time.After(2 * time.Minute):
		return f, fmt.Errorf("flood to %s: no report after 2 minutes", addr)
	}
}

// release closes the flood's connections and returns how many the server
// had closed while they were held.
func (f *flooder) release() int {
	f.stdin.Close()
	closed := -1
	select {
	case line := <-f.lines:
		if v, ok := strings.CutPrefix(line, "closed "); ok {
			closed, _ = strconv.Atoi(v)
		}
	case <-time.After(30 * time.Second):
	}
	// It exits by itself once it has reported; stop makes sure, by PID.
	f.p.stop(syscall.SIGTERM, 10*time.Second)
	return closed
}
