// Command hopstat tabulates hop traces (package hoptrace): for each
// directory of one traced run (the .tsv files of its processes), each
// request's first time at each hop of the control round trip, then the
// median µs between consecutive hops over every request from the -skip'th
// on, across all the directories given.
//
//	KVXFER_HOPTRACE=$dir go test -tags kvxfer_hoptrace ./test/twoproc \
//	    -run '^$' -bench 'ControlRoundTrip/^tcp$/^concurrency=1$/^$' -benchtime 1x
//	go run ./internal/hoptrace/hopstat $dir...
//
// One benchmark per directory: a pattern with fewer levels than a
// benchmark's name also runs the longer names below it, and their request
// ids would collide; hopstat refuses a directory of more than two files.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// hops is the round trip in order (names as the engine marks them).
var hops = []string{
	"gen.Receive", "rxparent.open", "rx.*actor.Started", "worker.send.*messages.RequestData",
	"zmq.encoded.*messages.RequestData", "zmq.sent.*messages.RequestData", "zmq.recv.*messages.RequestData",
	"listener.*messages.RequestData", "txparent.RequestData",
	"tx.*actors.txPeerRequestMsg", "worker.submit", "tx.core.TxSubmitted", "worker.batchDone",
	"tx.core.TxCompleted", "tx.core.TxFlushed", "worker.send.*messages.Result", "zmq.encoded.*messages.Result",
	"zmq.sent.*messages.Result", "zmq.recv.*messages.Result",
	"listener.*messages.Result", "rxparent.Result", "rx.core.RxFrame", "rx.finish", "gen.done",
}

// optional hops are absent on some paths: a stream whose completions prove
// delivery sends its Result with no flush (no TxFlushed).
var optional = map[string]bool{"tx.core.TxFlushed": true}

func main() {
	skip := flag.Int("skip", 100, "requests to leave out at the start of each run (connection set-up)")
	flag.Parse()
	type pair struct{ from, to string }
	var rows []pair // in the order first seen
	deltas := map[pair][]time.Duration{}
	var total []time.Duration
	for _, dir := range flag.Args() {
		reqs, err := load(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for id, at := range reqs {
			if n, err := strconv.Atoi(strings.TrimPrefix(id, "req-")); err != nil || n < *skip {
				continue
			}
			path, complete := hops[:0:0], true
			for _, h := range hops {
				if _, ok := at[h]; ok {
					path = append(path, h)
				} else if !optional[h] {
					complete = false // a hop missing: not the common path
					break
				}
			}
			if !complete {
				continue
			}
			for i := 1; i < len(path); i++ {
				k := pair{path[i-1], path[i]}
				if _, ok := deltas[k]; !ok {
					rows = append(rows, k)
				}
				deltas[k] = append(deltas[k], time.Duration(at[path[i]]-at[path[i-1]]))
			}
			total = append(total, time.Duration(at["gen.done"]-at["gen.Receive"]))
		}
	}
	if len(total) == 0 {
		fmt.Fprintln(os.Stderr, "hopstat: no request passed every hop")
		os.Exit(1)
	}
	fmt.Printf("| from | to | requests | p50 µs | p90 µs |\n| --- | --- | ---: | ---: | ---: |\n")
	for _, k := range rows {
		d := deltas[k]
		fmt.Printf("| %s | %s | %d | %.1f | %.1f |\n", k.from, k.to, len(d), us(quantile(d, 0.5)), us(quantile(d, 0.9)))
	}
	fmt.Printf("\n%d requests: Receive → READY p50 %.0f µs, p99 %.0f µs\n", len(total), us(quantile(total, 0.5)), us(quantile(total, 0.99)))
}

// load reads one run: request → hop → first time (ns).
func load(dir string) (map[string]map[string]int64, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.tsv"))
	if err != nil {
		return nil, err
	}
	// One run is two processes. More files are more runs, whose request
	// ids collide: a -bench pattern with fewer levels than a benchmark's
	// name also runs the longer names below it (add a last level "^$").
	if len(files) != 2 {
		return nil, fmt.Errorf("hopstat: %s holds %d trace files, want the 2 of one run (gen and ctx)", dir, len(files))
	}
	reqs := map[string]map[string]int64{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			parts := strings.Split(sc.Text(), "\t")
			if len(parts) != 3 {
				continue
			}
			ns, err := strconv.ParseInt(parts[2], 10, 64)
			if err != nil {
				continue
			}
			at := reqs[parts[1]]
			if at == nil {
				at = map[string]int64{}
				reqs[parts[1]] = at
			}
			if _, seen := at[parts[0]]; !seen {
				at[parts[0]] = ns
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return reqs, nil
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
