package report

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/kvxfer/kvxfer/internal/bench"
)

// Plot size: readable on a laptop screen and in a Markdown preview.
const (
	plotW = 18 * vg.Centimeter
	plotH = 11 * vg.Centimeter
)

var (
	computeColor  = color.RGBA{R: 0x4c, G: 0x72, B: 0xb0, A: 0xff}
	transferColor = color.RGBA{R: 0xdd, G: 0x84, B: 0x52, A: 0xff}
	readyColor    = color.RGBA{R: 0x55, G: 0xa8, B: 0x68, A: 0xff}
)

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

func save(p *plot.Plot, path string) error {
	return p.Save(plotW, plotH, path)
}

// sizeTicks labels a log2 byte axis at powers of 4 between min and max.
type sizeTicks struct{}

func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for v := math.Pow(2, math.Floor(math.Log2(lo))); v <= hi*1.0001; v *= 2 {
		label := ""
		if e := int(math.Round(math.Log2(v))); e%2 == 0 {
			label = sizeLabel(uint64(v))
		}
		ts = append(ts, plot.Tick{Value: v, Label: label})
	}
	return ts
}

func sizeLabel(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%gGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%gMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%gKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// bandwidthPlot: GB/s against bytes per operation — the raw backend by
// segment size, whole engine requests by request size (one and several in
// flight), and the raw peak.
func bandwidthPlot(r Results, path string) (bool, error) {
	p := newPlot("Bandwidth vs size", "bytes per batch (raw) or per request (engine)", "GB/s")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = sizeTicks{}
	var args []any
	lo, hi, top := math.Inf(1), math.Inf(-1), 0.0
	span := func(x float64) { lo, hi = min(lo, x), max(hi, x) }
	byBackend := map[string]plotter.XYs{}
	var order []string
	for _, m := range r.Raw {
		if m.Segments != 1 {
			continue
		}
		if _, ok := byBackend[m.Backend]; !ok {
			order = append(order, m.Backend)
		}
		byBackend[m.Backend] = append(byBackend[m.Backend], plotter.XY{X: float64(m.SizeBytes), Y: m.BytesPerSec / 1e9})
		span(float64(m.SizeBytes))
		top = max(top, m.BytesPerSec/1e9)
	}
	for _, b := range order {
		xys := byBackend[b]
		slices.SortFunc(xys, func(a, b plotter.XY) int { return int(math.Copysign(1, a.X-b.X)) })
		args = append(args, "raw "+b+" (bench raw)", xys)
	}
	if s := r.Small; s != nil {
		var raw, conc, serial plotter.XYs
		for _, z := range s.Sizes {
			x := float64(z.RequestBytes)
			span(x)
			raw = append(raw, plotter.XY{X: x, Y: z.RawBytesPerSec / 1e9})
			conc = append(conc, plotter.XY{X: x, Y: z.BytesPerSec / 1e9})
			serial = append(serial, plotter.XY{X: x, Y: z.SerialBytesPerSec / 1e9})
			top = max(top, z.RawBytesPerSec/1e9, z.BytesPerSec/1e9, z.SerialBytesPerSec/1e9, s.ConcurrentPeakBytesPerSec()/1e9)
		}
		args = append(args,
			"raw "+s.Backend+" at request size", raw,
			fmt.Sprintf("engine, %d requests in flight", s.Concurrency), conc,
			"engine, 1 request in flight", serial)
	}
	if len(args) == 0 {
		return false, nil
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return false, err
	}
	if s := r.Small; s != nil && s.ConcurrentPeakBytesPerSec() > 0 {
		y := s.ConcurrentPeakBytesPerSec() / 1e9
		peak, err := plotter.NewLine(plotter.XYs{{X: lo, Y: y}, {X: hi, Y: y}})
		if err != nil {
			return false, err
		}
		peak.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		peak.Color = color.Gray{Y: 0x40}
		p.Add(peak)
		p.Legend.Add(fmt.Sprintf("raw %s peak, %d in flight (over %s of distinct memory)", s.Backend, s.Concurrency, sizeLabel(s.PeakSpanBytes)), peak)
	}
	// The legend sits above the data, top left.
	p.Legend.Left = true
	p.Y.Min, p.Y.Max = 0, top*1.7
	return true, save(p, path)
}

// spans draws filled rectangles in data coordinates.
type spans struct {
	rects [][4]float64 // x0, x1, y0, y1
	color color.Color
}

func (s *spans) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for _, r := range s.rects {
		pts := []vg.Point{{X: trX(r[0]), Y: trY(r[2])}, {X: trX(r[1]), Y: trY(r[2])},
			{X: trX(r[1]), Y: trY(r[3])}, {X: trX(r[0]), Y: trY(r[3])}}
		c.FillPolygon(s.color, c.ClipPolygonXY(pts))
	}
}

func (s *spans) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, ymin = math.Inf(1), math.Inf(1)
	xmax, ymax = math.Inf(-1), math.Inf(-1)
	for _, r := range s.rects {
		xmin, xmax = min(xmin, r[0]), max(xmax, r[1])
		ymin, ymax = min(ymin, r[2]), max(ymax, r[3])
	}
	return
}

func (s *spans) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y}}
	c.FillPolygon(s.color, c.ClipPolygonXY(pts))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// timelinePlot: one panel per request (pipelined above, after prefill
// below), a row per chunk: its compute, then its transfer (fence fired →
// op completed), and READY.
func timelinePlot(tls []bench.ChunkTimeline, path string) (bool, error) {
	if len(tls) == 0 {
		return false, nil
	}
	var xmax float64
	for _, tl := range tls {
		xmax = max(xmax, ms(tl.Ready))
		for _, c := range tl.Chunks {
			xmax = max(xmax, ms(c.TransferEnd))
		}
	}
	plots := make([][]*plot.Plot, len(tls))
	for i, tl := range tls {
		p := newPlot(fmt.Sprintf("%s: READY %.1f ms after prefill began, %.2f ms after the last fence",
			tl.Mode, ms(tl.Ready), ms(tl.Exposed)), "ms since prefill began", "chunk")
		comp := &spans{color: computeColor}
		xfer := &spans{color: transferColor}
		var ticks []plot.Tick
		for _, c := range tl.Chunks {
			y := float64(c.Chunk)
			comp.rects = append(comp.rects, [4]float64{ms(c.ComputeStart), ms(c.ComputeEnd), y - 0.35, y + 0.35})
			xfer.rects = append(xfer.rects, [4]float64{ms(c.TransferStart), max(ms(c.TransferEnd), ms(c.TransferStart)+xmax/400), y - 0.35, y + 0.35})
			ticks = append(ticks, plot.Tick{Value: y, Label: fmt.Sprint(c.Chunk)})
		}
		ready, err := plotter.NewLine(plotter.XYs{{X: ms(tl.Ready), Y: -0.6}, {X: ms(tl.Ready), Y: float64(len(tl.Chunks)) - 0.4}})
		if err != nil {
			return false, err
		}
		ready.Color = readyColor
		ready.Width = vg.Points(2)
		p.Add(comp, xfer, ready)
		p.Legend.Add("compute (prefill of the chunk)", comp)
		p.Legend.Add("transfer (fence fired → op completed)", xfer)
		p.Legend.Add("READY on the generation side", ready)
		p.Legend.Top, p.Legend.Left = true, true
		p.X.Min, p.X.Max = 0, xmax*1.02
		p.Y.Min, p.Y.Max = -0.6, float64(len(tl.Chunks))+1.6 // room for the legend
		p.Y.Tick.Marker = plot.ConstantTicks(ticks)
		plots[i] = []*plot.Plot{p}
	}
	img := vgimg.New(plotW, plotH*vg.Length(len(tls))*0.8)
	dc := draw.New(img)
	t := draw.Tiles{Rows: len(tls), Cols: 1, PadY: vg.Centimeter * 0.5, PadTop: vg.Points(4), PadBottom: vg.Points(4),
		PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	canvases := plot.Align(plots, t, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return false, err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return false, err
	}
	return true, f.Close()
}

// cdfPlot: the share of requests whose exposed latency is at most x, per
// mode of the e2e batch.
func cdfPlot(e *bench.E2EResult, path string) (bool, error) {
	if e == nil || len(e.Modes) == 0 {
		return false, nil
	}
	p := newPlot(fmt.Sprintf("Exposed latency CDF: %d %s requests of %d..%d tokens", e.Requests, e.Model, e.MinTokens, e.MaxTokens),
		"last fence → READY (ms)", "fraction of requests")
	var args []any
	for _, m := range e.Modes {
		s := slices.Clone(m.Exposed)
		slices.Sort(s)
		xys := make(plotter.XYs, 0, 2*len(s))
		for i, d := range s {
			xys = append(xys, plotter.XY{X: ms(d), Y: float64(i) / float64(len(s))},
				plotter.XY{X: ms(d), Y: float64(i+1) / float64(len(s))})
		}
		args = append(args, fmt.Sprintf("%s (p50 %.2f ms, p99 %.2f ms)", m.Mode, ms(m.ExposedP50), ms(m.ExposedP99)), xys)
	}
	if err := plotutil.AddLines(p, args...); err != nil {
		return false, err
	}
	p.Legend.Left = false
	p.Legend.Top = false
	p.Legend.XOffs = -vg.Centimeter
	p.Legend.YOffs = vg.Centimeter
	p.X.Min, p.Y.Min, p.Y.Max = 0, 0, 1
	return true, save(p, path)
}

// pipeliningPlot: exposed latency against chunk size.
func pipeliningPlot(sw *bench.PipeliningSweep, path string) (bool, error) {
	if sw == nil || len(sw.Points) == 0 {
		return false, nil
	}
	p := newPlot(fmt.Sprintf("Exposed latency vs chunk size: %s, %d-token prompt, %v compute per token", sw.Model, sw.Prompt, sw.ComputePerToken),
		"chunk (tokens)", "last fence → READY (ms)")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = chunkTicks{}
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = ticks125{}
	var pipe, one, serial plotter.XYs
	lo, hi := math.Inf(1), 0.0
	for _, pt := range sw.Points {
		x := float64(pt.ChunkTokens)
		pipe = append(pipe, plotter.XY{X: x, Y: ms(pt.Exposed)})
		one = append(one, plotter.XY{X: x, Y: ms(pt.OneChunk)})
		serial = append(serial, plotter.XY{X: x, Y: ms(pt.Serial)})
		lo = min(lo, ms(pt.Exposed), ms(pt.OneChunk), ms(pt.Serial))
		hi = max(hi, ms(pt.Exposed), ms(pt.OneChunk), ms(pt.Serial))
	}
	if err := plotutil.AddLinePoints(p, "pipelined: last fence → READY", pipe, "one chunk alone: fence → READY", one,
		"after prefill: every chunk's transfer exposed", serial); err != nil {
		return false, err
	}
	p.Legend.Left = true
	// Room above the data for the legend (a log axis: a factor).
	p.Y.Min, p.Y.Max = lo/1.5, hi*6
	return true, save(p, path)
}

// ticks125 labels a log axis at 1, 2 and 5 times each power of ten.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for dec := math.Pow(10, math.Floor(math.Log10(lo))); dec <= hi; dec *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := dec * m; v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ts
}

type chunkTicks struct{}

func (chunkTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for v := math.Pow(2, math.Floor(math.Log2(lo))); v <= hi*1.0001; v *= 2 {
		ts = append(ts, plot.Tick{Value: v, Label: fmt.Sprint(v)})
	}
	return ts
}
