package zmq

import (
	zmq4 "github.com/pebbe/zmq4"
)

// ZAP (ZeroMQ RFC 27) status codes we answer with.
const (
	zapOK     = "200"
	zapDenied = "400"
)

// serveZAP answers the ZAP requests waiting on the handler socket (on the
// ZAP goroutine). A REP
// socket must answer each request before reading the next.
func (s *listener) serveZAP() {
	for range maxBatch {
		req, err := s.zap.RecvMessageBytes(zmq4.DONTWAIT)
		if err != nil {
			if !isAgain(err) {
				s.l.log.Warn().Err(err).Msg("control/zmq: ZAP receive")
			}
			return
		}
		if _, err := s.zap.SendMessageDontwait(s.zapReply(req)); err != nil {
			s.l.log.Warn().Err(err).Msg("control/zmq: ZAP reply")
			return
		}
	}
}

// zapReply decides one ZAP request: a CURVE handshake in our domain from
// an allowed client key passes, with the key (Z85) as the User-Id that
// the ROUTER's messages then carry; anything else is refused.
//
// Request: version, request id, domain, address, routing id, mechanism,
// credentials... Reply: version, request id, status code, status text,
// user id, metadata.
func (s *listener) zapReply(req [][]byte) [][]byte {
	version, reqID := []byte("1.0"), []byte{}
	if len(req) >= 2 {
		version, reqID = req[0], req[1]
	}
	deny := func(why string, key string, address []byte) [][]byte {
		s.l.stats.refused.Add(1)
		s.logRefused(why, key, string(address))
		return [][]byte{version, reqID, []byte(zapDenied), []byte("NO ACCESS"), {}, {}}
	}
	if len(req) < 6 || string(req[0]) != "1.0" {
		return deny("malformed ZAP request", "", nil)
	}
	domain, address, mechanism, creds := string(req[2]), req[3], string(req[5]), req[6:]
	if domain != zapDomain {
		return deny("ZAP domain "+domain, "", address)
	}
	if mechanism != "CURVE" || len(creds) != 1 || len(creds[0]) != 32 {
		return deny("mechanism "+mechanism, "", address)
	}
	key := zmq4.Z85encode(string(creds[0]))
	if !s.l.keyAllowed(key) {
		return deny("CURVE key not allowed", key, address)
	}
	return [][]byte{version, reqID, []byte(zapOK), []byte("OK"), []byte(key), {}}
}

// logRefused logs a refused handshake at warn, throttled per key (or
// address): a refused client may keep reconnecting.
func (s *listener) logRefused(why, key, address string) {
	from := address
	if from == "" {
		from = "a local peer" // ipc and inproc connections have no address
	}
	who := "address " + address
	if key != "" {
		who = "key " + key
	}
	ev := s.l.warn(who, "handshake refused")
	if ev == nil {
		return
	}
	ev = ev.Str("address", address)
	if key != "" {
		ev.Str("key", key).Msgf("control/zmq: refused CURVE handshake from %s: key %s is not allowed",
			from, keyPrefix(key))
		return
	}
	ev.Str("reason", why).Msgf("control/zmq: refused handshake from %s: %s", from, why)
}

// keyPrefix is the start of a Z85 key: enough to tell keys apart in a log.
func keyPrefix(key string) string {
	if len(key) <= 8 {
		return key
	}
	return key[:8] + "…"
}
