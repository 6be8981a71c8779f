package metrics

import "github.com/prometheus/client_golang/prometheus"

// PoolBlocks is one layer group's pool, by block state. The four counts
// partition the pool.
type PoolBlocks struct {
	Group       string
	Free        int
	Allocated   int // allocated, no pin
	Pinned      int
	Quarantined int
}

// Pools registers kvxfer_pool_blocks{group, state}, sampled from f at each
// scrape rather than kept up to date on every pin and free.
func (s *Set) Pools(f func() []PoolBlocks) error {
	return s.wrap.Register(&poolCollector{read: f, desc: prometheus.NewDesc(Namespace+"_pool_blocks",
		"Blocks of each layer group's pool, by state (free, allocated, pinned, quarantined); sampled at scrape.",
		[]string{"group", "state"}, nil)})
}

// poolCollector samples the pools at scrape time.
type poolCollector struct {
	read func() []PoolBlocks
	desc *prometheus.Desc
}

var _ prometheus.Collector = (*poolCollector)(nil)

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.read() {
		for _, v := range [...]struct {
			state string
			n     int
		}{{"free", p.Free}, {"allocated", p.Allocated}, {"pinned", p.Pinned}, {"quarantined", p.Quarantined}} {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v.n), p.Group, v.state)
		}
	}
}
