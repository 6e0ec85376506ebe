package ab

import (
	"math"
	"slices"
)

// Estimate is the paired comparison of one cell: the Hodges-Lehmann
// estimate of head/base (the median of the Walsh averages of the paired
// log-ratios) with its distribution-free confidence interval from the
// Wilcoxon signed-rank distribution, and the test's two-sided p-value.
type Estimate struct {
	Ratio, Lo, Hi float64 // head/base; Lo..Hi at Confidence
	Confidence    float64 // the interval's actual coverage (exact, so at least what was asked)
	P             float64 // two-sided Wilcoxon signed-rank p-value against ratio 1
	N             int     // pairs
}

// Paired compares head with base, pair by pair (base[i] and head[i] were
// measured next to each other, so load that hit one hit the other), at
// confidence conf (e.g. 0.99). Samples must be positive and equally many;
// fewer than 2 pairs give Ratio alone with an interval of 0..+Inf.
//
// Why this test: load on a shared machine moves both members of a pair
// together but not from pair to pair, so the pair's ratio carries the
// difference and the spread of ratios its noise; the signed-rank test
// assumes only that this spread is symmetric, not normal, and the
// Hodges-Lehmann interval it inverts to is what benchstat-style tools
// report for a location shift.
func Paired(base, head []float64, conf float64) Estimate {
	n := min(len(base), len(head))
	d := make([]float64, 0, n)
	for i := range n {
		if base[i] > 0 && head[i] > 0 {
			d = append(d, math.Log(head[i]/base[i]))
		}
	}
	n = len(d)
	e := Estimate{N: n, Ratio: math.NaN(), Lo: 0, Hi: math.Inf(1), P: 1}
	if n == 0 {
		return e
	}
	// Walsh averages: every (d_i + d_j)/2 with i <= j.
	w := make([]float64, 0, n*(n+1)/2)
	for i := range n {
		for j := i; j < n; j++ {
			w = append(w, (d[i]+d[j])/2)
		}
	}
	slices.Sort(w)
	e.Ratio = math.Exp(median(w))
	if n < 2 {
		return e
	}
	dist := signedRankCounts(n)
	total := math.Ldexp(1, n) // 2^n equally likely sign patterns under H0
	// The interval [w_(k), w_(m+1-k)] (1-based) covers with probability
	// 1 - 2*P(T <= k-1); take the largest k whose coverage is >= conf.
	m := len(w)
	k, cover := 0, 1.0
	cum := 0.0
	for c := 0; c < m/2; c++ {
		cum += dist[c]
		if 1-2*cum/total < conf {
			break
		}
		k, cover = c+1, 1-2*cum/total
	}
	e.Confidence = cover
	if k > 0 {
		e.Lo, e.Hi = math.Exp(w[k-1]), math.Exp(w[m-k])
	}
	e.P = signedRankP(d, dist, total)
	return e
}

// signedRankCounts returns, for n pairs, how many of the 2^n sign patterns
// give each signed-rank sum T+ = 0..n(n+1)/2 (exact; n up to a few hundred).
func signedRankCounts(n int) []float64 {
	m := n * (n + 1) / 2
	c := make([]float64, m+1)
	c[0] = 1
	for r := 1; r <= n; r++ {
		for t := m; t >= r; t-- {
			c[t] += c[t-r]
		}
	}
	return c
}

// signedRankP is the exact two-sided p-value of T+ (ties share ranks; zero
// differences count half to each side, which keeps A/A honest).
func signedRankP(d []float64, dist []float64, total float64) float64 {
	n := len(d)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		x, y := math.Abs(d[a]), math.Abs(d[b])
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	ranks := make([]float64, n)
	for i := 0; i < n; {
		j := i
		for j+1 < n && math.Abs(d[idx[j+1]]) == math.Abs(d[idx[i]]) {
			j++
		}
		r := float64(i+j)/2 + 1
		for k := i; k <= j; k++ {
			ranks[idx[k]] = r
		}
		i = j + 1
	}
	tplus := 0.0
	for i, x := range d {
		switch {
		case x > 0:
			tplus += ranks[i]
		case x == 0:
			tplus += ranks[i] / 2
		}
	}
	m := float64(len(dist) - 1)
	lowT := math.Min(tplus, m-tplus)
	cum := 0.0
	for t := 0; float64(t) <= lowT+1e-9 && t < len(dist); t++ {
		cum += dist[t]
	}
	return math.Min(1, 2*cum/total)
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
