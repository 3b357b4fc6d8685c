package adapter

import (
	"net/http/httptest"
	"testing"

	"github.com/kilnrl/kiln/internal/agent/protocol"
)

// What a keep-alive costs a streamed turn that answers before it is due
// (almost every turn): arming it and stopping it. A turn's whole CPU is
// ~400 µs on the load benchmark (BENCHMARKS.md).
func BenchmarkKeepAliveUnused(b *testing.B) {
	s := &Server{}
	req := &protocol.Request{Protocol: protocol.Anthropic, Stream: true}
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		if s.keepAlive(w, req, protocol.ReplyOptions{}).end() != nil {
			b.Fatal("a keep-alive started within the default interval")
		}
	}
}
