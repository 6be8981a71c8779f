package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Path is where a Server serves its handler.
const Path = "/metrics"

// Server serves one handler on Path over HTTP. It owns one goroutine,
// which Close waits for.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// Serve listens on addr ("host:port"; port 0 picks a free one, which Addr
// reports) and serves h on Path. The listener is bound when Serve returns.
func Serve(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, h)
	s := &Server{ln: ln, done: make(chan struct{}),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}}
	go func() {
		defer close(s.done)
		// Serve returns ErrServerClosed after Shutdown or Close, and any
		// other error only when the listener fails: there is no caller
		// left to tell, and scrapes simply stop.
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// Addr is the bound address ("127.0.0.1:9464").
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server: it lets scrapes in progress finish until ctx
// ends, then closes what remains, and returns once the serving goroutine
// has exited. It is safe to call more than once.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		// ctx ended with a scrape still running: cut it.
		err = s.srv.Close()
	}
	<-s.done
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
