package sandboxinit

import "sync"

// CappedBuffer is an io.Writer that keeps the first Limit bytes written and
// counts the rest, so a command's output cannot exhaust memory; Truncated
// says whether anything was dropped. Safe for concurrent use.
type CappedBuffer struct {
	mu    sync.Mutex
	limit int
	buf   []byte
	total int64
}

// NewCappedBuffer keeps up to limit bytes (limit <= 0 keeps nothing).
func NewCappedBuffer(limit int) *CappedBuffer { return &CappedBuffer{limit: limit} }

// Write never fails: bytes past the limit are counted and dropped.
func (b *CappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(len(p))
	if room := b.limit - len(b.buf); room > 0 {
		if room > len(p) {
			room = len(p)
		}
		b.buf = append(b.buf, p[:room]...)
	}
	return len(p), nil
}

// Bytes returns the kept bytes.
func (b *CappedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}

// Total is the number of bytes written, kept or not.
func (b *CappedBuffer) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// Truncated reports whether bytes were dropped.
func (b *CappedBuffer) Truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total > int64(len(b.buf))
}
