package discovery

import (
	"context"
	"fmt"
	"strings"
)

// Open returns the registry a --discovery flag names: "" or "static" for
// the static list peers, etcd://host:port[,host:port] for etcd under
// cluster.
func Open(ctx context.Context, spec, cluster string, peers []Record, opts ...Option) (Registry, error) {
	switch {
	case spec == "" || spec == "static":
		return NewStatic(peers, opts...)
	case strings.HasPrefix(spec, EtcdScheme):
		eps, err := ParseEtcdURL(spec)
		if err != nil {
			return nil, err
		}
		return NewEtcd(ctx, eps, cluster, opts...)
	}
	return nil, fmt.Errorf("%w %q: want static or etcd://host:port[,host:port]", ErrInvalidURL, spec)
}
