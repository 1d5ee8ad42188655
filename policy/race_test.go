//go:build race

package policy

// raceDetector is whether the tests run under -race, which drops
// sync.Pool items: what allocates per regexp match or buffer then differs.
const raceDetector = true
