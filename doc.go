// Package kvxfer is a KV-cache transfer engine for disaggregated LLM
// serving. A context (prefill) engine pushes a prompt's KV cache, chunk by
// chunk while prefill still runs, into a generation (decode) engine's paged
// pool, and guarantees that no page is freed or reused while a write may
// still read or land in it.
//
// Start builds one engine rank; Engine.Send opens the context side of a
// request (then TxHandle.Chunk per prefill chunk); Engine.Receive opens the
// generation side; Engine.Close drains and stops. The root package only
// wires the packages together: layouts and plans live in kvcache, the data
// plane in rdma, the control vocabulary in messages and the actors in
// actors.
//
// Concurrency: every method of Engine and the handles is safe for
// concurrent use. Handles deliver their outcome exactly once on Done.
package kvxfer
