package engine

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slow32 is what parseFinite32 must equal: ParseFloat to float64, then
// float32 (the encoding/json path's reading).
func slow32(s string) (float32, bool) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	return float32(f), true
}

// decimal32 answers exactly as strconv wherever it answers, and answers
// nearly always for the logprobs vLLM writes.
func TestDecimal32(t *testing.T) {
	cases := []struct {
		in string
		ok bool // decimal32 answers (else it leaves the number to strconv)
	}{
		{"0", true}, {"-0", true}, {"-0.0", true}, {"0.0000", true},
		{"-0.000012338161468505859", true}, {"-9999.0", true}, {"-1.2345678e-05", true},
		{"-2.3841855067985307e-07", true}, {"1E+2", true}, {"12.5e-1", true},
		{"-0.10000000149011612", true}, {"3.4028234663852886e+38", false},
		{"1e-45", false},                    // a float32 subnormal
		{"3.5e38", false},                   // past float32's range
		{"1e400", false}, {"1e-400", false}, // past the exponent table
		{"12345678901234567890", true}, {"-1.2345678901234567890123e-05", true},
		{"0.00000000000000000000001234", true},
		{"01", false}, {"-", false}, {".5", false}, {"1.", false}, {"1e", false}, {"1e+", false},
		{"+1", false}, {"1 ", false}, {"NaN", false}, {"Infinity", false}, {"1e1234", false},
	}
	for _, c := range cases {
		got, ok := decimal32([]byte(c.in))
		assert.Equal(t, c.ok, ok, "%q", c.in)
		if ok {
			want, wok := slow32(c.in)
			require.True(t, wok, "%q", c.in)
			assert.Equal(t, math.Float32bits(want), math.Float32bits(got), "%q: %v, want %v", c.in, got, want)
		}
	}

	rng := rand.New(rand.NewPCG(1, 2))
	check := func(s string) bool {
		t.Helper()
		got, ok := decimal32([]byte(s))
		if ok {
			want, _ := slow32(s)
			if math.Float32bits(want) != math.Float32bits(got) {
				t.Fatalf("%q: %v, want %v", s, got, want)
			}
		}
		return ok
	}

	// Logprobs as vLLM writes them: float32 values widened to float64 and
	// written shortest (Python's repr), and the same cut to fewer digits.
	answered, total := 0, 0
	for range 200_000 {
		v := -float32(math.Exp(rng.Float64()*40 - 30)) // about -1e-13 to -2e4
		for _, s := range []string{
			strconv.FormatFloat(float64(v), 'g', -1, 64),
			strconv.FormatFloat(float64(v), 'f', -1, 64),
			strconv.FormatFloat(float64(v), 'e', rng.IntN(20), 64),
		} {
			total++
			if check(s) {
				answered++
			}
		}
	}
	assert.Greater(t, float64(answered)/float64(total), 0.99, "answered %d of %d", answered, total)

	// Points halfway between two float32s, and next to them: float32
	// rounding turns on the last digit, which decimal32 must leave to
	// strconv unless it settles it exactly.
	for range 100_000 {
		v := math.Float32frombits(rng.Uint32N(0x7f000000) + 0x00800000)
		half := float64(v) + (float64(math.Nextafter32(v, math.MaxFloat32))-float64(v))/2
		for _, d := range []float64{half, math.Nextafter(half, 0), math.Nextafter(half, math.Inf(1))} {
			check(strconv.FormatFloat(d, 'g', -1, 64))
			check(strconv.FormatFloat(d, 'e', 16, 64))
		}
	}

	// Any decimal: random digits, point and exponent.
	digits := []byte("0123456789")
	for range 200_000 {
		var b []byte
		if rng.IntN(2) == 0 {
			b = append(b, '-')
		}
		n := 1 + rng.IntN(22)
		for k := range n {
			d := digits[rng.IntN(10)]
			if k == 0 && n > 1 && d == '0' {
				d = '1'
			}
			b = append(b, d)
		}
		if rng.IntN(2) == 0 {
			b = append(b, '.')
			for range 1 + rng.IntN(20) {
				b = append(b, digits[rng.IntN(10)])
			}
		}
		if rng.IntN(2) == 0 {
			b = strconv.AppendInt(append(b, 'e'), int64(rng.IntN(90)-45), 10)
		}
		check(string(b))
	}
}

// BenchmarkParseFinite32 reads a logprob as vLLM writes it, with the
// strconv baseline beside it.
func BenchmarkParseFinite32(b *testing.B) {
	in := []byte("-0.00012338161468505859")
	b.Run("kiln", func(b *testing.B) {
		for b.Loop() {
			if _, ok := parseFinite32(in); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("strconv", func(b *testing.B) {
		for b.Loop() {
			if _, ok := slow32(string(in)); !ok {
				b.Fatal("refused")
			}
		}
	})
}

// FuzzDecimal32: wherever decimal32 answers, strconv agrees bit for bit.
func FuzzDecimal32(f *testing.F) {
	for _, s := range []string{"-0.000012338161468505859", "-2.3841855067985307e-07", "0", "-0.0",
		"12.5e-1", "1e-45", "12345678901234567890.5", "-0.10000000149011612", "01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := decimal32([]byte(s))
		if !ok {
			return
		}
		want, wok := slow32(s)
		if !wok || math.Float32bits(want) != math.Float32bits(got) {
			t.Fatalf("%q: decimal32 %v, strconv %v (ok %v)", s, got, want, wok)
		}
	})
}
