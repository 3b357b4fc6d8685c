package engine

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http/httputil"
	"strconv"
)

// replyHead is what the h1 transport needs of a reply's head: its status
// and how its body is framed (RFC 9112 §6.3).
type replyHead struct {
	status int
	// length is the body's length: from Content-Length, 0 for a status
	// that has no body, -1 when the body is chunked or ends with the
	// connection.
	length  int64
	chunked bool
	// close: the connection cannot carry another request (Connection:
	// close, HTTP/1.0, or a body that ends with the connection).
	close bool
}

// readReplyHead reads a reply's status line and header fields, skipping
// interim (1xx) replies. Of the fields it reads only those that frame the
// body — Content-Length, Transfer-Encoding, Connection — and allocates
// nothing for the rest: the engine's replies carry a handful of fields the
// client never looks at, and net/http.ReadResponse built a canonicalized
// map of them for every one of a turn's four exchanges.
func readReplyHead(br *bufio.Reader) (replyHead, error) {
	for {
		h, err := readOneHead(br)
		if err != nil || h.status >= 200 {
			return h, err
		}
		if h.status == 101 {
			return h, errors.New("reply switches protocols (101), which was not asked for")
		}
	}
}

func readOneHead(br *bufio.Reader) (replyHead, error) {
	h := replyHead{length: -1}
	line, err := headLine(br)
	if err != nil {
		return h, err
	}
	// HTTP-version SP 3DIGIT [SP reason-phrase]
	proto, rest, _ := bytes.Cut(line, []byte(" "))
	// Reading the fields may move the line's bytes in br's buffer: what
	// is needed of it later is kept here.
	http10 := string(proto) == "HTTP/1.0"
	switch string(proto) {
	case "HTTP/1.1":
	case "HTTP/1.0":
		h.close = true
	default:
		return h, fmt.Errorf("malformed reply status line %q", line)
	}
	code, _, _ := bytes.Cut(rest, []byte(" "))
	if len(code) != 3 || code[0] < '1' || code[0] > '5' || !isDigits(code) {
		return h, fmt.Errorf("malformed reply status line %q", line)
	}
	h.status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')

	var te []byte
	haveTE := false
	for {
		line, err := headLine(br)
		if err != nil {
			return h, err
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			// Obsolete line folding continues the previous field; the
			// framing fields are single tokens, never folded by a real
			// server, so a fold is refused rather than interpreted.
			return h, fmt.Errorf("reply header line %q continues a folded field", line)
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 || bytes.ContainsAny(name, " \t") {
			return h, fmt.Errorf("malformed reply header line %q", line)
		}
		value = bytes.Trim(value, " \t")
		switch {
		case asciiFold(name, "content-length"):
			n, err := contentLength(value)
			if err != nil || (h.length >= 0 && n != h.length) {
				return h, fmt.Errorf("reply header Content-Length %q is not one non-negative length", value)
			}
			h.length = n
		case asciiFold(name, "transfer-encoding"):
			if haveTE {
				te = append(te, ',')
			}
			te, haveTE = append(te, value...), true
		case asciiFold(name, "connection"):
			for tok := range bytes.SplitSeq(value, []byte(",")) {
				if asciiFold(bytes.Trim(tok, " \t"), "close") {
					h.close = true
				}
			}
		}
	}
	switch {
	case h.status < 200 || h.status == 204 || h.status == 304:
		h.length = 0
	case haveTE && http10:
		// RFC 9112 §6.1: the framing of such a reply is faulty.
		return h, fmt.Errorf("HTTP/1.0 reply with Transfer-Encoding %q", te)
	case haveTE:
		// Chunked is the only coding the client decodes; it takes
		// precedence over a Content-Length (RFC 9112 §6.3).
		if !asciiFold(bytes.Trim(te, " \t"), "chunked") {
			return h, fmt.Errorf("reply Transfer-Encoding %q is not supported (only chunked)", te)
		}
		h.chunked, h.length = true, -1
	case h.length < 0:
		h.close = true // the body ends with the connection
	}
	return h, nil
}

// headLine reads one line of a reply's head without its line break; a
// line must fit in br's buffer.
func headLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("reply header line longer than %d bytes", br.Size())
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// contentLength parses a Content-Length value; a list of equal lengths
// ("5, 5", which some proxies send) is that length.
func contentLength(v []byte) (int64, error) {
	n := int64(-1)
	for part := range bytes.SplitSeq(v, []byte(",")) {
		part = bytes.Trim(part, " \t")
		if len(part) == 0 || len(part) > 18 || !isDigits(part) {
			return 0, errors.New("not a length")
		}
		m, _ := strconv.ParseInt(string(part), 10, 64)
		if n >= 0 && m != n {
			return 0, errors.New("lengths differ")
		}
		n = m
	}
	return n, nil
}

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// asciiFold reports whether b is lower, ignoring ASCII case; lower is
// lower case.
func asciiFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// readReply reads one reply whole: its status, its body (drawn from bufs
// when its length is known) and whether the connection can carry the next
// request.
func readReply(br *bufio.Reader, bufs *bufPool) (status int, body []byte, keep bool, err error) {
	h, err := readReplyHead(br)
	if err != nil {
		return 0, nil, false, err
	}
	switch {
	case h.length > maxResponse:
		return 0, nil, false, fmt.Errorf("reply larger than %d bytes", maxResponse)
	case h.chunked:
		body, err = readChunked(br, maxResponse)
	case h.length >= 0:
		body = bufs.get(int(h.length))[:h.length]
		_, err = io.ReadFull(br, body)
	default: // the body ends with the connection
		body, err = io.ReadAll(io.LimitReader(br, maxResponse+1))
		if err == nil && len(body) > maxResponse {
			err = fmt.Errorf("reply larger than %d bytes", maxResponse)
		}
	}
	if err != nil {
		return 0, nil, false, fmt.Errorf("reading reply: %w", err)
	}
	return h.status, body, !h.close, nil
}

// readChunked reads a chunked body whole, at most limit bytes, then its
// trailer section, which leaves br at the next reply.
func readChunked(br *bufio.Reader, limit int64) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(httputil.NewChunkedReader(br), limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("reply larger than %d bytes", limit)
	}
	for {
		line, err := headLine(br)
		if err != nil {
			return nil, fmt.Errorf("reading the trailer: %w", err)
		}
		if len(line) == 0 {
			return body, nil
		}
	}
}
