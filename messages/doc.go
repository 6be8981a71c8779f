// Package messages holds kvxfer's control-plane vocabulary: the frames two
// engines exchange (Hello, RequestData, Result, Cancel, CancelAck,
// Heartbeat) as plain Go values, with strict validation of every field.
//
// Frames are values: they carry no pointers into engine state and may be
// copied freely. Validate is called on every frame that arrives from a peer
// before any field is used; a frame that fails validation is rejected with a
// reason naming the field and value, and never reaches a session.
//
// The package imports nothing of the project.
package messages
