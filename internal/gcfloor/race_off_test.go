//go:build !race

package gcfloor

const raceOn = false
