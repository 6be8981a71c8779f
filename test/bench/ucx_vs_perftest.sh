#!/usr/bin/env bash
# ucx_vs_perftest.sh — kvxfer's ucx backend beside UCX's own ucx_perftest,
# in one run, under the same UCX_TLS.
#
# For each round and each size, alternating which goes first:
#   ucx_perftest -t ucp_put_bw -s SIZE   (a server and a client process on
#                                          127.0.0.1, ucx-utils)
#   kvxfer bench raw --backend ucx --peer-process --sizes SIZE --rounds 1 --json
# then prints, per size, the median bandwidth of each, and their ratio.
#
# Usage: test/bench/ucx_vs_perftest.sh [-r ROUNDS] [-s SIZES] [-b BYTES] [-i]
#   -r ROUNDS  rounds (default 5)
#   -s SIZES   comma-separated sizes with KiB/MiB suffix (default 64KiB,1MiB,16MiB)
#   -b BYTES   bytes moved per sample by each tool (default 256MiB)
#   -i         kvxfer's receiver in the sending process (default: a child
#              process, as ucx_perftest runs a server and a client)
# Environment:
#   UCX_TLS    as usual; unset means UCX's own choice. Both tools see it.
#   KVXFER     a kvxfer binary to use (default: go build ./cmd/kvxfer).
#
# What is compared: ucx_perftest's put bandwidth between two processes,
# from and into memory UCX allocated (its ucp_put_bw buffers), endpoints
# without error handling; kvxfer's rig sends from one process into another
# (with -i, both agents in one process), the destination from
# ucx.Agent.Alloc (UCP_MEM_MAP_ALLOCATE), endpoints with peer error
# handling, a window of batches of one segment each (enough for 64 MiB,
# 256 to 1024 of them), every batch flushed (remote completion) before its
# Done.
set -euo pipefail

rounds=5
sizes=64KiB,1MiB,16MiB
bytes=256MiB
peer=--peer-process
while getopts "r:s:b:ih" opt; do
	case $opt in
	r) rounds=$OPTARG ;;
	s) sizes=$OPTARG ;;
	b) bytes=$OPTARG ;;
	i) peer= ;;
	*) sed -n '2,28p' "$0"; exit 2 ;;
	esac
done

command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (Debian: apt-get install ucx-utils)" >&2; exit 1; }
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ -z ${KVXFER:-} ]]; then
	(cd "$root" && go build -o "$tmp/kvxfer" ./cmd/kvxfer)
	KVXFER=$tmp/kvxfer
fi

# bytes_of 64KiB → 65536
bytes_of() {
	local s=$1 n=${1%[KMG]iB}
	case $s in
	*KiB) echo $((n << 10)) ;; *MiB) echo $((n << 20)) ;; *GiB) echo $((n << 30)) ;; *) echo "$s" ;;
	esac
}

# perftest SIZE → bytes/s (ucx_perftest prints MB/s with MB = 2^20 bytes)
perftest() {
	local size=$1 n warm port out srv
	n=$(($(bytes_of "$bytes") / size))
	((n < 4)) && n=4
	# The same warm-up as kvxfer's rig: one window (rdmabench.WindowFor:
	# enough operations for 64 MiB, at least 256 and at most 1024), at most
	# one sample.
	warm=$(((64 << 20) / size))
	((warm < 256)) && warm=256
	((warm > 1024)) && warm=1024
	((warm > n)) && warm=$n
	for try in 1 2 3 4 5; do
		port=$((20000 + RANDOM % 20000))
		ucx_perftest -t ucp_put_bw -s "$size" -n "$n" -w "$warm" -f -p "$port" >"$tmp/server" 2>&1 &
		srv=$!
		out=""
		for _ in $(seq 50); do
			sleep 0.1
			if out=$(ucx_perftest 127.0.0.1 -t ucp_put_bw -s "$size" -n "$n" -w "$warm" -f -p "$port" 2>"$tmp/client.err"); then
				break
			fi
			out=""
			kill -0 "$srv" 2>/dev/null || break
		done
		wait "$srv" 2>/dev/null || true
		if [[ -n $out ]]; then
			# Final line: iterations, latency 50%/avg/overall, bandwidth avg/overall, rate avg/overall.
			echo "$out" | awk 'NF == 8 && $1 ~ /^[0-9]+$/ { bw = $6 } END { if (bw == "") exit 1; printf "%.0f\n", bw * 1048576 }'
			return
		fi
	done
	echo "ucx_perftest failed for size $size:" >&2
	cat "$tmp/server" "$tmp/client.err" >&2
	exit 1
}

# kvxfer SIZE → bytes/s
kvxfer() {
	"$KVXFER" bench raw --backend ucx $peer --sizes "$1" --rounds 1 --bytes "$bytes" --json 2>"$tmp/kvxfer.err" |
		awk -F'"bytes_per_sec":' 'NF > 1 { split($2, a, ","); printf "%.0f\n", a[1] }' ||
		{ cat "$tmp/kvxfer.err" >&2; exit 1; }
}

IFS=, read -ra size_list <<<"$sizes"
echo "UCX_TLS=${UCX_TLS-<unset>}  rounds=$rounds  bytes/sample=$bytes  kvxfer receiver: ${peer:+child process}${peer:-same process}  $(ucx_info -v | sed -n 's/^# \(Version .*\)/UCX \1/p')" >&2
for r in $(seq "$rounds"); do
	for s in "${size_list[@]}"; do
		b=$(bytes_of "$s")
		if ((r % 2)); then
			p=$(perftest "$b")
			k=$(kvxfer "$s")
		else
			k=$(kvxfer "$s")
			p=$(perftest "$b")
		fi
		echo "$s $p $k" >>"$tmp/samples"
		awk -v r="$r" -v s="$s" -v p="$p" -v k="$k" 'BEGIN { printf "round %d %-6s perftest %6.2f GB/s  kvxfer %6.2f GB/s\n", r, s, p / 1e9, k / 1e9 }' >&2
	done
done

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf '%-8s %16s %14s %7s   (median of %d; GB = 1e9 bytes)\n' SIZE "PERFTEST GB/s" "KVXFER GB/s" RATIO "$rounds"
for s in "${size_list[@]}"; do
	p=$(awk -v s="$s" '$1 == s { print $2 }' "$tmp/samples" | median)
	k=$(awk -v s="$s" '$1 == s { print $3 }' "$tmp/samples" | median)
	awk -v s="$s" -v p="$p" -v k="$k" 'BEGIN { printf "%-8s %16.2f %14.2f %7.2f\n", s, p / 1e9, k / 1e9, (p > 0 ? k / p : 0) }'
done
