// Package messages holds kvxfer's control-plane vocabulary: the frames two
// engines exchange (Hello, RequestData, Result, Cancel, CancelAck,
// Heartbeat, Misaddressed) as plain Go values, with strict validation of every field.
//
// Frames are values: they carry no pointers into engine state and may be
// copied freely. Validate is called on every frame that arrives from a peer
// before any field is used; a frame that fails validation is rejected with a
// reason naming the field and value, and never reaches a session.
//
// On the wire (DESIGN.md §6) every frame is one protobuf Envelope
// (proto/kvxfer.proto, generated into package pb by `make proto`) carrying
// Version. Encode validates before it writes, so an invalid frame never
// reaches the wire; Decode rejects input over MaxFrameBytes, another
// version, an unknown frame type or any out-of-range field, with an error
// wrapping ErrInvalid, and never panics on any input. Both are safe for
// concurrent use; a decoded frame shares no memory with the input.
//
// The package imports nothing of the project but its generated pb.
package messages
