package zmq

import "github.com/kvxfer/kvxfer/messages"

// encode, appendEncode and decode are the wire codec (the messages package's protobuf
// envelope). They are variables so a test can put a faulty twin in their
// place.
var (
	encode       = messages.Encode
	appendEncode = messages.AppendEncode
	decode       = messages.Decode
)
