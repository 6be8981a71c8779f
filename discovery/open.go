package discovery

import (
	"context"
	"crypto/tls"
	"fmt"
)

// Open returns the registry a --discovery flag names: "" or "static" for
// the static list peers, etcd://host:port[,host:port] for etcd under
// cluster, etcds://… for etcd over TLS (WithTLS's configuration, or the
// system's roots without one). WithTLS with a plaintext etcd:// URL is
// refused (ErrTLS): the connection would not use it.
func Open(ctx context.Context, spec, cluster string, peers []Record, opts ...Option) (Registry, error) {
	switch {
	case spec == "" || spec == "static":
		return NewStatic(peers, opts...)
	case IsEtcd(spec):
		eps, err := ParseEtcdURL(spec)
		if err != nil {
			return nil, err
		}
		o := buildOptions(opts)
		switch {
		case EtcdTLS(spec) && o.tls == nil:
			opts = append(opts, WithTLS(&tls.Config{MinVersion: tls.VersionTLS12}))
		case !EtcdTLS(spec) && o.tls != nil:
			return nil, fmt.Errorf("%w: TLS settings (a CA or a client certificate) given with the plaintext URL %q: use etcds://", ErrTLS, spec)
		}
		return NewEtcd(ctx, eps, cluster, opts...)
	}
	return nil, fmt.Errorf("%w %q: want static, etcd://host:port[,host:port] or etcds://host:port[,host:port]", ErrInvalidURL, spec)
}
