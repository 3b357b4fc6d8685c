package engine

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadReply: replies as a server may frame them, each followed on the
// connection by a next reply. Where net/http.ReadResponse (the reader the
// transport used before) accepts a reply, readReply must read the same
// status, the same body and the same keep-alive verdict, and leave the
// connection at the next reply; the rest are refused with a message.
func TestReadReply(t *testing.T) {
	const next = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"
	cases := []struct {
		name, reply string
		// oracle: net/http reads it alike (else it is read as 200 "{}").
		// err: readReply refuses it with a message containing this.
		oracle bool
		err    string
		// alone: the reply is all the connection carries.
		alone bool
	}{
		{name: "content length", reply: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\nServer: uvicorn\r\n\r\n{\"a\":12}", oracle: true},
		{name: "no reason phrase", reply: "HTTP/1.1 200\r\nContent-Length: 2\r\n\r\n{}", oracle: true},
		{name: "bare line feeds", reply: "HTTP/1.1 200 OK\nContent-Length: 2\n\n{}", oracle: true},
		{name: "field names in any case, space around values", reply: "HTTP/1.1 200 OK\r\ncontent-LENGTH:   3 \r\n\r\n[1]", oracle: true},
		{name: "equal lengths listed", reply: "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\n{}"}, // RFC 9110 §8.6; net/http refuses it
		{name: "equal lengths repeated", reply: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n[1]", oracle: true},
		{name: "empty body", reply: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", oracle: true},
		{name: "error status", reply: "HTTP/1.1 400 Bad Request\r\nContent-Length: 13\r\n\r\n{\"error\":\"x\"}", oracle: true},
		{name: "chunked", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3;ext=1\r\n:1}\r\n0\r\n\r\n", oracle: true},
		{name: "chunked with a trailer", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: 1\r\n\r\n", oracle: true},
		{name: "chunked wins over a length", reply: "HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", oracle: true},
		{name: "connection close", reply: "HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\n{}", oracle: true},
		{name: "HTTP/1.0", reply: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", oracle: true},
		{name: "HTTP/1.0 keep-alive is not kept", reply: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}", oracle: true},
		{name: "no content", reply: "HTTP/1.1 204 No Content\r\n\r\n", oracle: true},
		{name: "not modified", reply: "HTTP/1.1 304 Not Modified\r\n\r\n", oracle: true},
		{name: "interim reply first", reply: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"},
		{name: "body until close", alone: true, reply: "HTTP/1.1 200 OK\r\n\r\n{\"to\":\"the end\"}", oracle: true},

		{name: "lengths differ", reply: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n[1]]", err: "Content-Length"},
		{name: "listed lengths differ", reply: "HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n[1]]", err: "Content-Length"},
		{name: "negative length", reply: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", err: "Content-Length"},
		{name: "length not a number", reply: "HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n", err: "Content-Length"},
		{name: "short body", alone: true, reply: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", err: "reading reply"},
		{name: "other transfer coding", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", err: "Transfer-Encoding"},
		{name: "HTTP/1.0 with a transfer coding", reply: "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", err: "HTTP/1.0"},
		{name: "malformed chunk size", reply: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", err: "reading reply"},
		{name: "status not a number", reply: "HTTP/1.1 2x0 OK\r\n\r\n", err: "status line"},
		{name: "other protocol", reply: "HTTP/2 200 OK\r\n\r\n", err: "status line"},
		{name: "not HTTP", reply: "{\"tokens\":[1]}\r\n", err: "status line"},
		{name: "header line without a colon", reply: "HTTP/1.1 200 OK\r\nContent-Length 2\r\n\r\n{}", err: "header line"},
		{name: "space in a field name", reply: "HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\n{}", err: "header line"},
		{name: "folded field", reply: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n 2\r\n\r\n{}", err: "folded"},
		{name: "switching protocols", reply: "HTTP/1.1 101 Switching Protocols\r\n\r\n", err: "101"},
		{name: "head cut short", alone: true, reply: "HTTP/1.1 200 OK\r\nContent-Len", err: "unexpected EOF"},
		{name: "header line too long", reply: "HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("a", 40<<10) + "\r\n\r\n", err: "longer than"},
	}
	var bufs bufPool
	for _, c := range cases {
		// Read whole at once, and a byte per read: then a head arrives
		// in pieces, and its first line moves in the reader's buffer.
		for _, trickle := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/trickle=%v", c.name, trickle), func(t *testing.T) {
				stream := c.reply
				if !c.alone {
					stream += next
				}
				var src io.Reader = strings.NewReader(stream)
				if trickle {
					src = iotest.OneByteReader(src)
				}
				br := bufio.NewReaderSize(src, 32<<10)
				status, body, keep, err := readReply(br, &bufs)
				if c.err != "" {
					if err == nil || !strings.Contains(err.Error(), c.err) {
						t.Fatalf("got status %d body %q err %v, want an error containing %q", status, body, err, c.err)
					}
					return
				}
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if c.oracle {
					obr := bufio.NewReader(strings.NewReader(stream))
					resp, err := http.ReadResponse(obr, nil)
					if err != nil {
						t.Fatalf("net/http refuses it: %v", err)
					}
					want, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil {
						t.Fatalf("net/http body: %v", err)
					}
					wantKeep := !resp.Close && resp.ProtoAtLeast(1, 1)
					if status != resp.StatusCode || string(body) != string(want) || keep != wantKeep {
						t.Fatalf("read status %d body %q keep %v; net/http: %d %q %v", status, body, keep, resp.StatusCode, want, wantKeep)
					}
				} else if status != 200 || string(body) != "{}" || !keep {
					t.Fatalf("read status %d body %q keep %v, want 200 \"{}\" true", status, body, keep)
				}
				if c.alone {
					if keep {
						t.Fatal("a body that ends with the connection keeps it")
					}
					return
				}
				if keep {
					s, b, _, err := readReply(br, &bufs)
					if err != nil || s != 200 || string(b) != "next" {
						t.Fatalf("the next reply reads as %d %q %v: the body was not read to its end", s, b, err)
					}
				}
			})
		}
	}
}

// FuzzReadReply: no input panics readReply, and where both readers accept
// a final reply they read the same status, body and keep-alive verdict.
func FuzzReadReply(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
	f.Add("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX: 1\r\n\r\n")
	f.Add("HTTP/1.0 404 Not Found\r\nConnection: close\r\n\r\nnope")
	f.Add("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
	f.Fuzz(func(t *testing.T, reply string) {
		var bufs bufPool
		status, body, keep, err := readReply(bufio.NewReaderSize(strings.NewReader(reply), 4096), &bufs)
		if err != nil || status < 200 {
			return
		}
		resp, oerr := http.ReadResponse(bufio.NewReaderSize(strings.NewReader(reply), 4096), nil)
		if oerr != nil || resp.StatusCode < 200 {
			return
		}
		want, oerr := io.ReadAll(resp.Body)
		if oerr != nil {
			return
		}
		if status != resp.StatusCode || string(body) != string(want) || keep != (!resp.Close && resp.ProtoAtLeast(1, 1)) {
			t.Fatalf("%q: read %d %q keep %v; net/http %d %q close %v", reply, status, body, keep, resp.StatusCode, want, resp.Close)
		}
	})
}
