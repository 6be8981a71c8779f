package loopback

// Option configures an Agent.
type Option func(*config)

type config struct {
	network *Network
}

// WithNetwork puts the agent in network n instead of the process-wide one.
func WithNetwork(n *Network) Option {
	return func(c *config) { c.network = n }
}
