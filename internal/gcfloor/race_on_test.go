//go:build race

package gcfloor

// raceOn: the race detector's shadow memory faults in on the first write
// of each heap page, warmed or not, so page faults say nothing of warm.
const raceOn = true
