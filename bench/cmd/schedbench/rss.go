package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/warden-dev/warden/scheduler"
)

// Memory with a million queued runs, each store measured in a fresh
// process (-rss-child).

type rssResult struct {
	RSS     float64 `json:"rss"`
	RSSFile float64 `json:"rss_file"` // of which file-backed (the mapped store)
	Heap    float64 `json:"heap"`
	File    float64 `json:"file,omitempty"` // store file size
}

func rssOf(kind string, n int) rssResult {
	out, err := exec.Command(os.Args[0], "-rss-child", kind, "-queued-n", strconv.Itoa(n)).Output()
	if err != nil {
		panic(fmt.Sprintf("rss child %s: %v", kind, err))
	}
	var r rssResult
	if err := json.Unmarshal(out, &r); err != nil {
		panic(fmt.Sprintf("rss child %s: %q: %v", kind, out, err))
	}
	return r
}

func rssMain(kind string, n int) {
	var keep any
	switch kind {
	case "chan":
		ch := make(chan scheduler.Delivery, n)
		for i := range n {
			ch <- scheduler.Delivery{RunID: strconv.Itoa(i + 1), Name: "job", Attempt: 1, Input: append([]byte(nil), input...)}
		}
		keep = ch
	default:
		r, release := blockedRig(kind)
		submitAll(n+1, 512, func(int) { r.submit(append([]byte(nil), input...)) })
		keep = r
		defer release()
	}
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res := rssResult{RSS: procStatus("VmRSS:"), RSSFile: procStatus("RssFile:"), Heap: float64(ms.HeapInuse)}
	if r, ok := keep.(*rig); ok && r.dir != "" {
		if fi, err := os.Stat(filepath.Join(r.dir, "runs.db")); err == nil {
			res.File = float64(fi.Size())
		}
	}
	json.NewEncoder(os.Stdout).Encode(res)
	runtime.KeepAlive(keep)
}

func procStatus(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	return 0
}

// drainProfile, when set, receives a CPU profile of an admission drain
// alone (not of the submissions that fill the queue).
