package shellagent

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestResolve(t *testing.T) {
	cases := []struct{ host, port, want, err string }{
		{"127.0.0.1", "18080", "127.0.0.1:18080", ""},
		{"::1", "80", "[::1]:80", ""},
		{"LocalHost", "1", "127.0.0.1:1", ""},
		{"127.0.0.1", "http", "", "port \"http\""},
		{"127.0.0.1", "70000", "", "port \"70000\""},
		{"no-such-host.invalid", "80", "", "no DNS resolver"},
	}
	for _, tc := range cases {
		got, err := resolve(tc.host, tc.port)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.host)
			continue
		}
		require.NoError(t, err, tc.host)
		assert.Equal(t, tc.want, got.String())
	}
}

func TestLookupHosts(t *testing.T) {
	f := filepath.Join(t.TempDir(), "hosts")
	require.NoError(t, os.WriteFile(f, []byte("# comment\n10.0.0.7 adapter adapter.local # trailing\n::ffff:10.0.0.8 mapped\nbogus line\n"), 0o644))
	for host, want := range map[string]string{"adapter": "10.0.0.7", "ADAPTER.local": "10.0.0.7", "mapped": "10.0.0.8", "comment": "", "line": ""} {
		ip, ok := lookupHosts(f, host)
		assert.Equal(t, want != "", ok, host)
		if ok {
			assert.Equal(t, want, ip.String(), host)
		}
	}
	_, ok := lookupHosts(filepath.Join(t.TempDir(), "none"), "adapter")
	assert.False(t, ok)
}

func TestReadResponse(t *testing.T) {
	cases := []struct {
		name, in string
		status   int
		body     string
		err      string
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 200, "hello", ""},
		{"chunked with extension and trailer", "HTTP/1.1 500 Internal\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n", 500, "abcde", ""},
		{"1xx first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", 201, "ok", ""},
		{"to eof", "HTTP/1.0 200 OK\r\n\r\nuntil the end", 200, "until the end", ""},
		{"bare LF", "HTTP/1.1 404 Not Found\nContent-Length: 1\n\nx", 404, "x", ""},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc", 0, "", "body: unexpected EOF"},
		{"bad status", "SMTP 220 hi\r\n\r\n", 0, "", "malformed status line"},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", 0, "", "bad Content-Length"},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, "", "bad chunk size"},
		{"cut chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", 0, "", "unexpected EOF"},
		{"nothing", "", 0, "", "status line: unexpected EOF"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, body, err := readResponse(bufio.NewReader(strings.NewReader(tc.in)))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.status, st)
			assert.Equal(t, tc.body, string(body))
		})
	}
}
