package listener

import "time"

// waitTick paces the wait for hijacked connections, as fasthttp paces its
// own wait for open connections (100 ms); draining is not latency-critical.
func waitTick() <-chan time.Time { return time.After(100 * time.Millisecond) }
