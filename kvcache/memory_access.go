package kvcache

// TensorBlock returns the region range [off, off+n) that block b of global
// layer's part spans in m: from its first element to the end of its last,
// with whatever padding the strides leave between elements. ok is false
// for a layer m does not hold, or a part or block outside m.
func (m *KVMemory) TensorBlock(layer, part int, b BlockID) (off, n uint64, ok bool) {
	i := m.layerIndex(layer)
	if i < 0 || part < 0 || part >= m.Parts || part >= len(m.Base[i]) || b < 0 || int(b) >= m.Blocks ||
		m.TokensPerBlock < 1 || m.Heads < 1 || m.HeadDim < 1 {
		return 0, 0, false
	}
	off, ok = mulAdd(m.Base[i][part], uint64(b), m.BlockStride)
	if ok {
		n, ok = mulAdd(uint64(m.ElemBytes), uint64(m.TokensPerBlock-1), m.TokenStride)
	}
	if ok {
		n, ok = mulAdd(n, uint64(m.Heads-1), m.HeadStride)
	}
	if ok {
		n, ok = mulAdd(n, uint64(m.HeadDim-1), m.ElemStride)
	}
	if ok {
		_, ok = addOK(off, n)
	}
	return off, n, ok
}
