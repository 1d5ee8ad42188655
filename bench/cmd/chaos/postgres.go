package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// postgres is a private PostgreSQL server: initdb into a temporary
// directory and the server on a free loopback port, never the shared one.
// As root both run as the postgres user (initdb refuses root). It is
// started by the first scenario that needs it and stopped, its directory
// removed, when the harness ends.
type postgres struct {
	e    *env
	bin  string // the server's bin directory
	dir  string
	data string
	addr string
	cred *syscall.Credential
	p    *proc
}

// postgres returns the private server, starting it the first time.
func (e *env) postgres(ctx context.Context) (*postgres, error) {
	if e.pg != nil {
		return e.pg, nil
	}
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return nil, fmt.Errorf("no initdb under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
	}
	sort.Slice(bins, func(i, j int) bool { return pgVersion(bins[i]) < pgVersion(bins[j]) })
	pg := &postgres{e: e, bin: filepath.Dir(bins[len(bins)-1])}
	dir, err := os.MkdirTemp("", "warden-chaos-pg-")
	if err != nil {
		return nil, err
	}
	pg.dir, pg.data = dir, filepath.Join(dir, "data")
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("initdb refuses root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		pg.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	e.pg = pg
	logPath := filepath.Join(e.logDir, "postgres.log")
	initdb, err := e.shared.start(spawn{name: "initdb", logPath: logPath, dir: dir, attr: pg.attr(),
		bin: filepath.Join(pg.bin, "initdb"), args: []string{"-D", pg.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"}})
	if err != nil {
		return nil, err
	}
	select {
	case <-initdb.done:
	case <-ctx.Done():
		initdb.kill()
		return nil, ctx.Err()
	}
	if code := initdb.cmd.ProcessState.ExitCode(); code != 0 {
		return nil, fmt.Errorf("initdb exited %d: %s", code, tail(logPath, 3))
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	pg.addr = ports[0]
	return pg, pg.start(ctx)
}

// pgVersion orders bin directories by their major version.
func pgVersion(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

func (pg *postgres) attr() *syscall.SysProcAttr {
	// If the harness dies the server shuts down at once (SIGQUIT), taking
	// its backends with it.
	return &syscall.SysProcAttr{Credential: pg.cred, Pdeathsig: syscall.SIGQUIT}
}

// url is a connection string for database db as the postgres user.
func (pg *postgres) url(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&connect_timeout=5", pg.addr, db)
}

// start runs the server and waits until it accepts a login.
func (pg *postgres) start(ctx context.Context) error {
	_, port, _ := net.SplitHostPort(pg.addr)
	p, err := pg.e.shared.start(spawn{name: "postgres", logPath: filepath.Join(pg.e.logDir, "postgres.log"), dir: pg.dir, attr: pg.attr(),
		bin: filepath.Join(pg.bin, "postgres"),
		args: []string{"-D", pg.data, "-p", port, "-k", pg.dir, "-c", "listen_addresses=127.0.0.1",
			"-c", "max_connections=200", "-c", "fsync=off", "-c", "shared_buffers=32MB"}})
	if err != nil {
		return err
	}
	pg.p = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := pgx.Connect(cctx, pg.url("postgres"))
		cancel()
		if err == nil {
			c.Close(ctx)
			return nil
		}
		if p.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("postgres on %s not accepting logins: %v (%s)", pg.addr, err, tail(filepath.Join(pg.e.logDir, "postgres.log"), 3))
		}
		time.Sleep(50 * time.Millisecond) // the server has no readiness event to wait on from here
	}
}

// crash stops the server by its PID with an immediate shutdown (SIGQUIT:
// every backend is cut, as in a crash; the next start recovers).
func (pg *postgres) crash() {
	if pg.p != nil {
		pg.p.stop(syscall.SIGQUIT, 30*time.Second)
		pg.p = nil
	}
}

// exec runs one statement on database db directly (not through warden).
func (pg *postgres) exec(ctx context.Context, db, sql string) error {
	c, err := pgx.Connect(ctx, pg.url(db))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql)
	return err
}

// stopPostgres shuts the private server down (fast: SIGINT) and removes
// its directory.
func (e *env) stopPostgres() {
	if e.pg == nil {
		return
	}
	if e.pg.p != nil {
		e.pg.p.stop(syscall.SIGINT, 30*time.Second)
	}
	e.shared.sweep(10 * time.Second)
	os.RemoveAll(e.pg.dir)
	e.pg = nil
}
