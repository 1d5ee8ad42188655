package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The table make bench-scheduler prints: a figure per row, warden beside
// the channel baseline, the ratio and the goal.

type unit int

const (
	perSec unit = iota
	dur
	bytesUnit
)

type row struct {
	label        string
	warden, base float64
	u            unit
	goal         string
}

func goalFor(what, kind string) func(float64) string {
	switch {
	case what == "admit" && kind == "memory":
		return func(v float64) string { return goalMin("≥ 200,000/s", v, 200000) }
	case what == "submit" && kind == "bbolt":
		return func(v float64) string { return goalMin("≥ 20,000/s", v, 20000) }
	}
	return func(float64) string { return "" }
}

func goalMin(goal string, v, min float64) string {
	if v >= min {
		return goal + " met"
	}
	return goal + " MISSED"
}

func goalMax(goal string, v, max float64) string {
	if goal == "" {
		return ""
	}
	if v <= max {
		return goal + " met"
	}
	return goal + " MISSED"
}

func format(v float64, u unit) string {
	switch u {
	case perSec:
		return commas(v) + "/s"
	case dur:
		d := time.Duration(v)
		switch {
		case d < time.Microsecond:
			return fmt.Sprintf("%dns", d.Nanoseconds())
		case d < time.Millisecond:
			return fmt.Sprintf("%.1fµs", float64(d)/1e3)
		}
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f MB", v/1e6)
}

func print(rows []row) {
	w := 0
	for _, r := range rows {
		w = max(w, len([]rune(r.label)))
	}
	fmt.Printf("%-*s  %14s  %16s  %9s  %s\n", w, "figure", "warden", "baseline (chan)", "ratio", "goal")
	for _, r := range rows {
		ratio := r.warden / r.base
		rs := fmt.Sprintf("%.2f×", ratio)
		if r.u == perSec {
			rs = fmt.Sprintf("%.3f×", ratio)
		}
		fmt.Printf("%-*s  %14s  %16s  %9s  %s\n", w+len(r.label)-len([]rune(r.label)), r.label, format(r.warden, r.u), format(r.base, r.u), rs, r.goal)
	}
	fmt.Println("\nratio = warden / baseline: the fraction of the channel's throughput kept, or how many times its latency or memory.")
}

func commas(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func percentile(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(float64(len(s))*p))])
}
