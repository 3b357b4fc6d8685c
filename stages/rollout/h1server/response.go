package h1server

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// response is the http.ResponseWriter of one request: the status and
// header as they stood at WriteHeader (later changes are ignored, as
// net/http ignores them) and the whole body, sent by conn.write.
type response struct {
	c      *conn
	req    *http.Request
	header http.Header
	status int
	head   []byte // the handler's header fields, written at WriteHeader
	body   []byte
	close  bool // send Connection: close and close after
	sniff  bool // the handler set no Content-Type
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

// Flush is http.Flusher's: the response is sent whole when the handler
// returns, so there is nothing to send earlier.
func (w *response) Flush() {}

// bodyAllowed reports whether a response with this status has a body.
func bodyAllowed(status int) bool {
	return !(status >= 100 && status <= 199 || status == http.StatusNoContent || status == http.StatusNotModified)
}

// write sends w whole: status line, the handler's fields, Date,
// Content-Type (sniffed when the handler set none), Content-Length,
// Connection, then the body (none for HEAD).
func (c *conn) write(w *response) error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
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
		case head && len(w.body) == 0 && cl != "":
			b = append(b, "Content-Length: "...) // the length a GET would have
			b = append(b, cl...)
			b = append(b, "\r\n"...)
		case head && len(w.body) == 0:
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
	body := w.body
	if head || !bodyAllowed(w.status) {
		body = nil
	}
	return c.sock.WriteBuffers([][]byte{b, body})
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
