package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuTime is the user+system CPU a process and its children (nginx's
// workers) have used so far. Per request, it is the cost of a proxy that
// the other processes on the machine disturb least: a busy machine slows a
// proxy's throughput down but does not make each request cost more CPU.
func cpuTime(pid int) time.Duration {
	total := procCPU(pid)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(child); ok && ppid == pid {
			total += procCPU(child)
		}
	}
	return total
}

// statFields returns /proc/PID/stat's fields after the command name.
func statFields(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

func procCPU(pid int) time.Duration {
	f := statFields(pid)
	if len(f) < 13 {
		return 0
	}
	// Fields 14 and 15 of stat (utime, stime) are 11 and 12 here.
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * clockTick
}

func parentOf(pid int) (int, bool) {
	f := statFields(pid)
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// idleTime is the CPU time the machine's CPUs have spent idle (idle and
// iowait in /proc/stat's cpu line). Per request at saturation it is the
// capacity a path leaves unused while its requests wait on one another's
// wake-ups: with every process sharing the same cores, it is what
// separates two proxies that spend the same CPU per request but do not
// reach the same throughput.
func idleTime() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0
	}
	idle, _ := strconv.ParseInt(f[4], 10, 64)
	iowait, _ := strconv.ParseInt(f[5], 10, 64)
	return time.Duration(idle+iowait) * clockTick
}
