// Package sysmon keeps the Go runtime's system monitor (sysmon) out of its
// deep sleep in the processes kvxfer starts itself, where the control
// round trip would otherwise pay for it.
//
// Why: when every P of a Go process is idle — as a kvxfer process is
// between two control frames, waiting for its peer — sysmon goes into a
// deep sleep, and the next cgo call (every zmq call is one) wakes it and
// resets its period to 20 µs, from where it takes at least 50 polls
// (1 ms) to back off. A round trip of the control plane idles once per
// request, so under a steady stream of requests sysmon polls every 20 µs
// for good: on a process that has one CPU to itself, every poll is two
// context switches on the CPU that carries the round trip (measured in
// BENCHMARKS.md, "Control round trip: the runtime's sysmon": 0.7× the round
// trip with the deep sleep off). The runtime has one switch that keeps
// sysmon out of the deep sleep, GODEBUG's schedtrace (sysmon then backs
// off to 10 ms polls while the process idles, as in any busy Go process);
// Setting sets it to the longest period it takes, so that its trace line
// is printed at most once every 24.8 days of uptime.
//
// GODEBUG is read once, when the runtime starts, so Reexec replaces the
// process with itself (same pid, same open files) under the setting: the
// kvxfer command does it first thing. A process that embeds kvxfer as a
// library (Go, the C ABI, Python) sets GODEBUG=schedtrace=2147483647 in
// its environment before it starts, if it wants the same; kvxfer cannot
// do it from inside.
//
// Nothing changes when GODEBUG already sets schedtrace, or when
// KVXFER_SYSMON=deep (the runtime's default kept).
package sysmon
