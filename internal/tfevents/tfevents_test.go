package tfevents

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
	"reflect"
	"strings"
	"testing"
)

// TestMaskedCRC: CRC-32C's check value (RFC 3720 B.4: "123456789" ->
// 0xe3069283), masked as TFRecord masks it.
func TestMaskedCRC(t *testing.T) {
	if c := crc32.Checksum([]byte("123456789"), castagnoli); c != 0xe3069283 {
		t.Fatalf("crc32c = %#x, want 0xe3069283", c)
	}
	c := uint32(0xe3069283)
	want := ((c >> 15) | (c << 17)) + 0xa282ead8
	if got := MaskedCRC([]byte("123456789")); got != want {
		t.Fatalf("MaskedCRC = %#x, want %#x", got, want)
	}
}

// TestRoundTrip: what Writer writes, ReadAll reads back, framing and
// fields; the first record is the file version; values are float32.
func TestRoundTrip(t *testing.T) {
	var b bytes.Buffer
	w, err := NewWriter(&b, 1700000000.5)
	if err != nil {
		t.Fatal(err)
	}
	steps := []Event{
		{WallTime: 1700000001, Step: 1, Scalars: []Scalar{{"pass/pass_rate", 0.25}, {"loss/loss", -1.5e-3}}},
		{WallTime: 1700000002, Step: 300, Scalars: []Scalar{{"tokens/prompt", 123456789}}},
		{WallTime: 1700000003, Step: 301},
	}
	for _, e := range steps {
		if err := w.Scalars(e.Step, e.WallTime, e.Scalars); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadAll(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	want := append([]Event{{WallTime: 1700000000.5, FileVersion: FileVersion}}, steps...)
	for i := range want {
		for j, s := range want[i].Scalars {
			want[i].Scalars[j].Value = float64(float32(s.Value))
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back %+v\nwant %+v", got, want)
	}
	// The first record's framing, by hand: its length, then its CRC.
	size := binary.LittleEndian.Uint64(b.Bytes()[:8])
	if MaskedCRC(b.Bytes()[:8]) != binary.LittleEndian.Uint32(b.Bytes()[8:12]) || size == 0 {
		t.Fatalf("first record's header %x is not TFRecord framing", b.Bytes()[:12])
	}
	if math.Float32bits(float32(0.25)) != math.Float32bits(float32(got[1].Scalars[0].Value)) {
		t.Fatal("0.25 did not survive as a float32")
	}
}

// TestCorrupt: a flipped byte anywhere in a record is an error naming
// which CRC failed.
func TestCorrupt(t *testing.T) {
	var b bytes.Buffer
	w, _ := NewWriter(&b, 1)
	w.Scalars(1, 2, []Scalar{{"a", 1}})
	w.Flush()
	for _, tc := range []struct {
		at   int
		want string
	}{{0, "length's CRC"}, {13, "data's CRC"}, {b.Len() - 1, "data's CRC"}} {
		c := bytes.Clone(b.Bytes())
		c[tc.at] ^= 0x40
		_, err := ReadAll(bytes.NewReader(c))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("byte %d flipped: err %v, want one about the %s", tc.at, err, tc.want)
		}
	}
	if _, err := ReadAll(bytes.NewReader(b.Bytes()[:b.Len()-2])); err == nil {
		t.Error("a truncated file read without an error")
	}
}
