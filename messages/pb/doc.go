// Package pb is the protoc-gen-go output for messages/proto/kvxfer.proto,
// the control plane's wire schema. Regenerate it with `make proto`; never
// edit kvxfer.pb.go by hand.
//
// Nothing outside package messages should use it: messages.Encode and
// messages.Decode convert between these types and the validated Go frames.
package pb
