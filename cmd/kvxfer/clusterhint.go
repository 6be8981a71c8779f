package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/discovery"
	"github.com/kvxfer/kvxfer/internal/proc"
	"github.com/kvxfer/kvxfer/messages"
)

// clusterHintEvery is how often a role whose peers have no rank in its
// etcd cluster looks at the other clusters.
var clusterHintEvery = time.Second

// notRegistered is in package node's words for a peer rank that never
// registered in its cluster ("gen/0 (not registered in etcd cluster C)"):
// the failures clusterHint's hint is added to.
const notRegistered = "(not registered in etcd cluster "

// clusterHint watches, while a role runs with etcd discovery, for the
// mistake its peers' silence does not name: the peer instance (--peer)
// has no rank in this role's --cluster but has ranks in another cluster
// of the same etcd (a typo, another case, another deployment's name).
// Each side waits for its own cluster only, so both fail with "(not
// registered in etcd cluster C)" and nothing says where the peers are.
// The first time it sees that it logs a warning; stop ends the watch and
// returns the hint ("" when the peer instance had a rank in this cluster
// the last time etcd was read, when no other cluster ever held one, or
// when etcd could not be read).
func clusterHint(ctx context.Context, o proc.Options) (stop func() string) {
	opts, err := o.EtcdOptions()
	if err != nil || !discovery.IsEtcd(o.Discovery) {
		return func() string { return "" }
	}
	ctx, cancel := context.WithCancel(ctx)
	var (
		mu   sync.Mutex
		hint string
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(clusterHintEvery)
		defer t.Stop()
		warned := false
		for {
			got, err := discovery.Clusters(ctx, o.Discovery, opts...)
			if err == nil {
				h, found := peerElsewhere(got, o.Cluster, o.Peer)
				if found {
					mu.Lock()
					hint = ""
					mu.Unlock()
					return // the peers are in this cluster: nothing to tell
				}
				if h != "" {
					// Kept once those peers are gone: they may have given
					// up first.
					mu.Lock()
					hint = h
					mu.Unlock()
				}
				if h != "" && !warned {
					warned = true
					o.Log.Warn().Str("cluster", o.Cluster).Msg(h)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() string {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return hint
	}
}

// peerElsewhere is the hint for clusters (discovery.Clusters) when
// instance has no rank in cluster but has ranks in others; found says
// that it has ranks in cluster.
func peerElsewhere(clusters map[string][]messages.PeerID, cluster, instance string) (hint string, found bool) {
	has := func(ids []messages.PeerID) []string {
		var out []string
		for _, id := range ids {
			if id.Instance == instance {
				out = append(out, id.String())
			}
		}
		return out
	}
	if len(has(clusters[cluster])) > 0 {
		return "", true
	}
	var where []string
	for _, c := range slices.Sorted(maps.Keys(clusters)) {
		if c == cluster {
			continue
		}
		if ranks := has(clusters[c]); len(ranks) > 0 {
			where = append(where, fmt.Sprintf("%s registered in cluster %q", strings.Join(ranks, ", "), c))
		}
	}
	if len(where) == 0 {
		return "", false
	}
	return fmt.Sprintf("no %s rank is registered in etcd cluster %q (--cluster), but %s: give every ctx and gen process the same --cluster",
		instance, cluster, strings.Join(where, " and ")), false
}
