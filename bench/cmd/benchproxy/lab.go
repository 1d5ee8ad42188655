package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

// path is one way to reach the upstream.
type path struct {
	name, addr string
	pid        int    // the process whose CPU the path costs (the proxy; the upstream for direct)
	missing    string // why it was not measured
}

// lab is the processes of one run: the upstream and every proxy in
// front of it, each with its log in out.
type lab struct {
	out   string   // the output directory
	self  string   // this binary, which also serves the upstream, the floors and the relay
	ports []string // free ports; ports[0] is the upstream's
	procs []*proc  // started, stopped in reverse order
}

// launch starts a process of the lab and returns its PID.
func (l *lab) launch(name string, env []string, bin string, args ...string) (int, error) {
	p, err := start(l.out, name, env, bin, args...)
	if err != nil {
		return 0, err
	}
	l.procs = append(l.procs, p)
	return p.cmd.Process.Pid, nil
}

// stop ends every process, the last started first.
func (l *lab) stop() {
	for i := len(l.procs) - 1; i >= 0; i-- {
		l.procs[i].stop()
	}
}

// startPaths starts the upstream and every path to it, in the order of
// the table's rows; a proxy that is not installed is a path with missing
// set.
func (l *lab) startPaths(warden string) ([]path, error) {
	upAddr := l.ports[0]
	pid, err := l.launch("upstream", nil, l.self, "upstream", upAddr)
	if err != nil {
		return nil, err
	}
	paths := []path{{name: "direct", addr: upAddr, pid: pid}}
	w, err := l.startWarden(warden, "warden", "", nil, l.ports[1], l.ports[2], l.ports[3])
	if err != nil {
		return nil, err
	}
	paths = append(paths, w...)
	// The same warden on one P (GOMAXPROCS=1): on a machine this small,
	// shared with the generator and the upstream, it shows what the Go
	// scheduler's idle-P spinning and thread wake-ups cost.
	w1, err := l.startWarden(warden, "warden-1p", " 1P", []string{"GOMAXPROCS=1"}, l.ports[6], l.ports[7], l.ports[8])
	if err != nil {
		return nil, err
	}
	paths = append(paths, w1...)
	floors, err := l.startFloors()
	if err != nil {
		return nil, err
	}
	paths = append(paths, floors...)
	relay, err := l.startRelay()
	if err != nil {
		return nil, err
	}
	nginx, err := l.startNginx()
	if err != nil {
		return nil, err
	}
	ha, err := l.startHAProxy()
	if err != nil {
		return nil, err
	}
	return append(paths, relay, nginx, ha), nil
}

// startWarden starts warden (bin) with its ingress and egress in front of
// the upstream: the paths "warden ingress"+row and "warden egress"+row.
// name names its log, policy file and data directory.
func (l *lab) startWarden(bin, name, row string, env []string, ingress, egress, admin string) ([]path, error) {
	upAddr := l.ports[0]
	policy := filepath.Join(l.out, name+".yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(wardenYAML, admin, ingress, upAddr, egress, upAddr)), 0o644); err != nil {
		return nil, err
	}
	pid, err := l.launch(name, env, bin, "run", "--policy", policy, "--data-dir", filepath.Join(l.out, name+"-data"), "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	return []path{{name: "warden ingress" + row, addr: ingress, pid: pid}, {name: "warden egress" + row, addr: egress, pid: pid}}, nil
}

// startFloors starts the fasthttp floors (serveFloor): plain, raw I/O and
// pipelined.
func (l *lab) startFloors() ([]path, error) {
	var paths []path
	for _, fl := range []struct{ row, log, addr, mode string }{
		{"fasthttp floor", "floor", l.ports[9], ""},
		{"floor, raw I/O", "floor-raw", l.ports[10], "raw"},
		{pipelinedRow, "floor-pipelined", l.ports[12], "pipelined"},
	} {
		pid, err := l.launch(fl.log, nil, l.self, "floor", fl.addr, l.ports[0], fl.mode)
		if err != nil {
			return nil, err
		}
		paths = append(paths, path{name: fl.row, addr: fl.addr, pid: pid})
	}
	return paths, nil
}

// startRelay starts the epoll relay (serveRelay), on Linux only.
func (l *lab) startRelay() (path, error) {
	relayPath := path{name: relayRow, addr: l.ports[11]}
	if runtime.GOOS != "linux" {
		relayPath.missing = "needs Linux (epoll)"
		return relayPath, nil
	}
	pid, err := l.launch("relay", nil, l.self, "relay", l.ports[11], l.ports[0])
	if err != nil {
		return path{}, err
	}
	relayPath.pid = pid
	return relayPath, nil
}

// startNginx starts nginx as a keep-alive reverse proxy, when installed.
func (l *lab) startNginx() (path, error) {
	nginxPath := path{name: "nginx", addr: l.ports[4]}
	bin, err := exec.LookPath("nginx")
	if err != nil {
		nginxPath.missing = "nginx not installed (apt-get install -y nginx)"
		return nginxPath, nil
	}
	dir := filepath.Join(l.out, "nginx")
	_ = os.MkdirAll(filepath.Join(dir, "logs"), 0o755)
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(nginxConf, dir, dir, l.ports[0], nginxPath.addr)), 0o644); err != nil {
		return path{}, err
	}
	pid, err := l.launch("nginx", nil, bin, "-p", dir+"/", "-c", conf, "-e", "stderr", "-g", "daemon off;")
	if err != nil {
		nginxPath.missing = err.Error()
	} else {
		nginxPath.pid = pid
	}
	return nginxPath, nil
}

// startHAProxy starts HAProxy as a keep-alive reverse proxy, when
// installed.
func (l *lab) startHAProxy() (path, error) {
	haPath := path{name: "haproxy", addr: l.ports[5]}
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		haPath.missing = "haproxy not installed (apt-get install -y haproxy)"
		return haPath, nil
	}
	conf := filepath.Join(l.out, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(haproxyCfg, haPath.addr, l.ports[0])), 0o644); err != nil {
		return path{}, err
	}
	pid, err := l.launch("haproxy", nil, bin, "-f", conf, "-db")
	if err != nil {
		haPath.missing = err.Error()
	} else {
		haPath.pid = pid
	}
	return haPath, nil
}

const wardenYAML = `version: 1
shutdown_grace: 5s
admin: { listen: %s }
ingress:
  listen: %s
  worker: http://%s
  tenant: { header: x-tenant-id, rate: 1000000000, window: 60 }
egress:
  http_listen: %s
  allow_unlisted: false
  tenant: { header: x-tenant-id, rate: 1000000000, window: 60 }
targets:
  - name: api
    hosts: [api.bench]
    upstream: http://%s
    circuit_breaker: { enabled: true }
    pools: [api]
pools:
  api: { concurrency: 100000, rate: 1000000000, window: 60, queue: 1000 }
`

// nginxConf: 2 workers, keep-alive to the upstream, no logging.
const nginxConf = `worker_processes 2;
pid %s/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %s/tmp;
  upstream up { server %s; keepalive 128; }
  server {
    listen %s;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`

// haproxyCfg: 2 threads, keep-alive both sides, connection reuse.
const haproxyCfg = `global
  nbthread 2
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
  http-reuse always
frontend fe
  bind %s
  default_backend be
backend be
  server up %s maxconn 1000
`

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// start runs a process with its output in out/<name>.log; env is added
// to this process's environment.
func start(out, name string, env []string, bin string, args ...string) (*proc, error) {
	log, err := os.Create(filepath.Join(out, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(p.done) }()
	return p, nil
}

// stop ends the process by its PID: SIGTERM, then SIGKILL after 5 s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func freePorts(n int) []string {
	var lns []net.Listener
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return addrs
}

// waitServing waits until addr answers an HTTP request.
func waitServing(addr string) error {
	deadline := time.Now().Add(20 * time.Second)
	c := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
		req.Host = "api.bench"
		req.Header.Set("X-Tenant-Id", "bench")
		if resp, err := c.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("not serving after 20 s")
}
