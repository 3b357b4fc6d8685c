package h1server

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// response is the http.ResponseWriter of one request: the status and
// header as they stood at WriteHeader (later changes are ignored, as
// net/http ignores them) and the body. A response the handler never
// flushes is sent whole, with its length, by conn.write; one it flushes is
// sent as net/http sends it: the head at the first Flush (chunked on
// HTTP/1.1 unless the handler set a length; on HTTP/1.0 the connection's
// close ends it), then what was written since at each Flush, and the rest
// when the handler returns.
type response struct {
	c      *conn
	req    *http.Request
	header http.Header
	status int
	head   []byte // the handler's header fields, written at WriteHeader
	body   []byte // written and not yet sent
	close  bool   // send Connection: close and close after
	sniff  bool   // the handler set no Content-Type

	sent    bool  // the head was sent by a Flush; body is what follows
	chunked bool  // what follows the head is framed in chunks
	err     error // a send failed: nothing more is sent
	bufs    [5][]byte
	size    [20]byte
}

func (w *response) Header() http.Header { return w.header }

func (w *response) WriteHeader(code int) {
	if w.status != 0 {
		return
	}
	if code < 100 || code > 999 {
		panic("h1server: invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code < 200 {
		return // informational responses are not sent (see the package doc)
	}
	w.status = code
	w.head = appendFields(w.head[:0], w.header)
	if v := w.header["Connection"]; len(v) > 0 && strings.EqualFold(v[0], "close") {
		w.close = true
	}
	if _, set := w.header["Content-Type"]; !set && bodyAllowed(code) {
		w.sniff = true // as net/http: a nil value set by the handler means none
	}
}

func (w *response) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	w.body = append(w.body, p...)
	return len(p), nil
}

// Flush is http.Flusher's: it sends the head, if not sent yet, and what
// was written since the last Flush. Like every ResponseWriter method it
// must not run concurrently with another.
func (w *response) Flush() {
	if w.err != nil {
		return
	}
	if !w.sent {
		if w.status == 0 {
			w.WriteHeader(http.StatusOK)
		}
		w.sent = true
		w.close = w.close || w.req.Close // the head says so now
		w.err = w.send(w.c.appendHead(w, true), false)
		return
	}
	w.err = w.send(nil, false)
}

// send writes head and the body written since the last send, framed as
// the response's body is framed, with the terminating chunk when last.
// It writes nothing when there is nothing to write.
func (w *response) send(head []byte, last bool) error {
	bufs := w.bufs[:0]
	if len(head) > 0 {
		bufs = append(bufs, head)
	}
	p := w.sendable()
	switch {
	case !w.chunked:
		if len(p) > 0 {
			bufs = append(bufs, p)
		}
	case len(p) > 0:
		size := append(strconv.AppendInt(w.size[:0], int64(len(p)), 16), "\r\n"...)
		bufs = append(bufs, size, p, crlf)
	}
	if w.chunked && last {
		bufs = append(bufs, lastChunk)
	}
	w.body = w.body[:0]
	if len(bufs) == 0 {
		return nil
	}
	err := w.c.sock.WriteBuffers(bufs)
	clear(w.bufs[:]) // keep no pointers into the buffers sent
	return err
}

var crlf, lastChunk = []byte("\r\n"), []byte("0\r\n\r\n")

// sendable is the part of the written body the response may carry: none
// for HEAD or a status without a body.
func (w *response) sendable() []byte {
	if w.req.Method == http.MethodHead || !bodyAllowed(w.status) {
		return nil
	}
	return w.body
}

// bodyAllowed reports whether a response with this status has a body.
func bodyAllowed(status int) bool {
	return !(status >= 100 && status <= 199 || status == http.StatusNoContent || status == http.StatusNotModified)
}

// write sends what the handler left to send: the whole response, or the
// rest of a flushed one.
func (c *conn) write(w *response) error {
	if w.sent {
		if w.err != nil {
			return w.err
		}
		return w.send(nil, true)
	}
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return c.sock.WriteBuffers([][]byte{c.appendHead(w, false), w.sendable()})
}

// appendHead returns the response head (in c.head's memory): status line,
// the handler's fields, Date, Content-Type (sniffed from what was written
// when the handler set none), the framing of the body (its length when
// whole; when flushed the handler's length, chunks on HTTP/1.1, the
// connection's close on HTTP/1.0) and Connection.
func (c *conn) appendHead(w *response, flushed bool) []byte {
	http10 := !w.req.ProtoAtLeast(1, 1)
	b := c.head[:0]
	if http10 {
		b = append(b, "HTTP/1.0 "...) // as net/http answers a 1.0 client
	} else {
		b = append(b, "HTTP/1.1 "...)
	}
	b = strconv.AppendInt(b, int64(w.status), 10)
	b = append(b, ' ')
	if t := http.StatusText(w.status); t != "" {
		b = append(b, t...)
	} else {
		b = append(b, "status code "...)
		b = strconv.AppendInt(b, int64(w.status), 10)
	}
	b = append(b, "\r\n"...)
	b = append(b, w.head...)
	b = append(b, "Date: "...)
	b = c.date.append(b, time.Now())
	b = append(b, "\r\n"...)
	head := w.req.Method == http.MethodHead
	if bodyAllowed(w.status) {
		if w.sniff && len(w.body) > 0 {
			b = append(b, "Content-Type: "...)
			b = append(b, http.DetectContentType(w.body)...)
			b = append(b, "\r\n"...)
		}
		switch cl := w.header.Get("Content-Length"); {
		case (head || flushed) && cl != "" && (!head || len(w.body) == 0):
			b = append(b, "Content-Length: "...) // the handler's (for HEAD: the length a GET would have)
			b = append(b, cl...)
			b = append(b, "\r\n"...)
		case head && (flushed || len(w.body) == 0):
		case flushed && http10:
			w.close = true // the body ends with the connection
		case flushed:
			w.chunked = true
			b = append(b, "Transfer-Encoding: chunked\r\n"...)
		default:
			b = append(b, "Content-Length: "...)
			b = strconv.AppendInt(b, int64(len(w.body)), 10)
			b = append(b, "\r\n"...)
		}
	}
	switch {
	case http10 && !w.close:
		b = append(b, "Connection: keep-alive\r\n"...)
	case !http10 && w.close:
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	c.head = b
	return b
}

// appendFields writes h's fields as net/http writes them: fields the
// server writes itself are left out, names that are not tokens dropped,
// line breaks in values turned into spaces.
func appendFields(b []byte, h http.Header) []byte {
	for name, vs := range h {
		switch name {
		case "Content-Length", "Transfer-Encoding", "Date", "Connection":
			continue
		}
		if !validName(name) {
			continue
		}
		for _, v := range vs {
			b = append(b, name...)
			b = append(b, ": "...)
			for i := 0; i < len(v); i++ {
				switch ch := v[i]; ch {
				case '\r', '\n':
					b = append(b, ' ')
				default:
					b = append(b, ch)
				}
			}
			b = append(b, "\r\n"...)
		}
	}
	return b
}

// validName reports whether name is an HTTP token (RFC 9110 §5.6.2).
func validName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		ch := name[i]
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", ch) >= 0:
		default:
			return false
		}
	}
	return true
}

// dateCache is a connection's Date value, formatted once a second.
type dateCache struct {
	sec int64
	b   []byte
}

func (d *dateCache) append(b []byte, now time.Time) []byte {
	if s := now.Unix(); s != d.sec || d.b == nil {
		d.sec, d.b = s, now.UTC().AppendFormat(d.b[:0], http.TimeFormat)
	}
	return append(b, d.b...)
}
