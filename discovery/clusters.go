package discovery

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvxfer/kvxfer/messages"
)

// Clusters lists, by cluster name, the ranks that hold a live record (one
// under a lease) in the etcd that spec names (etcd://… or etcds://…,
// with the options of Open: WithTLS, WithAuth, WithClient). It is what a
// rank whose peers never register in its own cluster shows its user: the
// peers may run under another --cluster (a typo, another case), which
// nothing else tells — each side waits for its own cluster only.
//
// It reads the keys under KeyRoot with their values (etcd tells a key's
// lease only with its value), within ctx and the dial timeout; keys that
// are not a rank's record are skipped. Ranks are sorted per cluster.
func Clusters(ctx context.Context, spec string, opts ...Option) (map[string][]messages.PeerID, error) {
	eps, err := ParseEtcdURL(spec)
	if err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	switch {
	case EtcdTLS(spec) && o.tls == nil:
		o.tls = &tls.Config{MinVersion: tls.VersionTLS12}
	case !EtcdTLS(spec) && o.tls != nil && o.client == nil:
		return nil, fmt.Errorf("%w: TLS settings (a CA or a client certificate) given with the plaintext URL %q: use etcds://", ErrTLS, spec)
	}
	cli := o.client
	if cli == nil {
		if !EtcdTLS(spec) {
			o.tls = nil
		}
		// ctx, not Background: with a user, New authenticates before it
		// returns, and that wait must end with ctx too (the CLI's hint
		// is stopped as its run ends).
		if cli, err = dial(ctx, eps, o, false); err != nil {
			return nil, fmt.Errorf("discovery: etcd %v: %w", eps, err)
		}
		defer cli.Close()
	}
	gctx, cancel := context.WithTimeout(ctx, o.dialTimeout)
	defer cancel()
	resp, err := cli.Get(gctx, KeyRoot, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("discovery: etcd %v: reading %s: %w", eps, KeyRoot, err)
	}
	out := map[string][]messages.PeerID{}
	for _, kv := range resp.Kvs {
		if kv.Lease == 0 {
			continue // an incarnation key, or a value no peer accepts
		}
		cluster, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), KeyRoot), "/")
		if !ok || CheckCluster(cluster) != nil {
			continue
		}
		id, isInc, err := parseKey(ClusterPrefix(cluster), string(kv.Key))
		if err != nil || isInc {
			continue
		}
		out[cluster] = append(out[cluster], id)
	}
	for c := range out {
		slices.SortFunc(out[c], func(a, b messages.PeerID) int {
			if n := strings.Compare(a.Instance, b.Instance); n != 0 {
				return n
			}
			return int(a.Rank - b.Rank)
		})
	}
	return out, nil
}
