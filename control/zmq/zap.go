package zmq

import (
	zmq4 "github.com/pebbe/zmq4"
)

// ZAP (ZeroMQ RFC 27) status codes we answer with.
const (
	zapOK     = "200"
	zapDenied = "400"
)

// maxDeniedLogged bounds the refused keys the listener remembers to log
// once each.
const maxDeniedLogged = 1024

// serveZAP answers the ZAP requests waiting on the handler socket. A REP
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

// logRefused logs a refused handshake, once per key (a refused client
// keeps reconnecting).
func (s *listener) logRefused(why, key, address string) {
	if key != "" {
		if s.deniedLogged == nil {
			s.deniedLogged = map[string]bool{}
		}
		if s.deniedLogged[key] || len(s.deniedLogged) >= maxDeniedLogged {
			return
		}
		s.deniedLogged[key] = true
	}
	who := key
	if who == "" {
		who = "address " + address
	}
	s.l.warn(who, "handshake").Str("reason", why).Str("key", key).Str("address", address).
		Msg("control/zmq: handshake refused")
}
