// Command warden is the sidecar proxy and egress governor. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/cmd/warden/app"
	"github.com/warden-dev/warden/internal/gcfloor"
	"github.com/warden-dev/warden/policy"
)

// version is set at build time with -ldflags "-X main.version=..."; without
// it the module's build info is used.
var version = ""

const usage = `warden — sidecar proxy and egress governor

Usage:
  warden run      --policy FILE [--data-dir DIR] [--log-format json|text] [--log-level info]
  warden validate FILE...
  warden version
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], stderr)
	case "validate":
		return validateCmd(args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "warden", buildVersion())
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "warden: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v := bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " " + s.Value[:12]
			}
		}
		if v != "" {
			return v + " " + bi.GoVersion
		}
	}
	return "(devel)"
}

// validateMemoryLimit is the soft memory limit warden validate parses
// under, unless GOMEMLIMIT is set. The largest policy (policy.Parse's node
// bound) is some 45 MB of YAML tree while it is decoded; left to GOGC=100
// alone, the collector let garbage grow to about twice that, and 1 MiB
// files peaked at up to 122 MB resident, 62-77 MB under this limit
// (docs/operations.md, "Policy files"). warden run keeps its own collector settings: a limit
// there would bind the traffic too.
const validateMemoryLimit = 56 << 20

// validateCmd checks every file and prints every problem as
// FILE:LINE:COL: message, so it can gate commits and CI.
func validateCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "warden validate: no policy file given\n\n"+usage)
		return 2
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		defer debug.SetMemoryLimit(debug.SetMemoryLimit(validateMemoryLimit))
	}
	bad := false
	for _, file := range args {
		p, err := policy.Load(file)
		if err != nil {
			bad = true
			var errs policy.Errors
			if errors.As(err, &errs) {
				printLines(stderr, errs.Lines())
			} else {
				fmt.Fprintf(stderr, "%s: %v\n", file, err)
			}
			continue
		}
		for i, w := range p.WarningLines() {
			if i < len(p.Warnings) {
				w += " (warning)"
			}
			fmt.Fprintln(stderr, w)
		}
		fmt.Fprintf(stdout, "%s: ok\n", file)
	}
	if bad {
		return 1
	}
	return 0
}

func runCmd(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	policyFile := fs.String("policy", "", "policy file (YAML, version 1)")
	dataDir := fs.String("data-dir", "./data", "directory for the embedded run store (bbolt) or, with the postgres store, this sidecar's id; one warden per directory")
	logFormat := fs.String("log-format", "text", "log format: json or text")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *policyFile == "" {
		fmt.Fprintln(stderr, "warden run: --policy FILE is required")
		return 2
	}
	if fs.NArg() > 0 {
		// "warden run --policy a.yaml b.yaml" must not quietly run a.yaml
		// alone; flags after a word are not parsed either.
		fmt.Fprintf(stderr, "warden run: unexpected argument %q (run takes flags only: --policy FILE ...)\n", fs.Arg(0))
		return 2
	}
	log, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "warden run:", err)
		return 2
	}
	// go-redis logs through a package-level logger; this process has one
	// log, so the library's lines join it.
	redis.SetLogger(redisLogger{log})

	// Unless GOGC is set, the collector keeps a heap goal of at least
	// gcfloor.Default (docs/operations.md, "Memory and GC").
	floor := gcfloor.Start(gcfloor.Default)
	defer floor.Stop()
	if floor != nil {
		log.Debug("GC heap goal floor", "bytes", gcfloor.Default)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	a, err := app.New(app.Options{PolicyFile: *policyFile, DataDir: *dataDir, Log: log, Version: buildVersion()})
	if err != nil {
		// A policy's errors are one log line with their count, then
		// listed (at most policy.MaxErrors of them) as validate does.
		var errs policy.Errors
		if !errors.As(err, &errs) {
			log.Error("cannot start", "err", err)
			return 1
		}
		log.Error("cannot start: the policy does not validate", "policy", *policyFile, "error_count", errs.Len())
		printLines(stderr, errs.Lines())
		return 1
	}
	if err := a.Run(ctx, hup); err != nil {
		log.Error("stopped with an error", "err", err)
		return 1
	}
	return 0
}

func printLines(w io.Writer, lines []string) {
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}
