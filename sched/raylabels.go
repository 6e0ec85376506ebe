package sched

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/tensorlane/tensorlane/topology"
)

// RayNodeLabels returns the labels a Ray node running on host h should
// start with (ray start --labels), in the vocabulary RaySpec's label
// selectors use: the accelerator type, availability zone and TPU slice
// under Ray's own keys, rack, block and NVLink domain under tensorlane's,
// the host itself under LabelHost, and any other host label as it is. A
// label whose key or value Ray would refuse (its syntax is Kubernetes')
// is left out and named in skipped, so nothing is silently changed.
func RayNodeLabels(h *topology.Host) (labels map[string]string, skipped []string) {
	labels = map[string]string{LabelHost: h.ID}
	keys := make([]string, 0, len(h.Labels))
	for k := range h.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := h.Labels[k]
		key := k
		if rk, ok := rayLabel[k]; ok {
			key = rk
		}
		if !validRayLabel(key, v) {
			skipped = append(skipped, fmt.Sprintf("%s=%s", k, v))
			continue
		}
		labels[key] = v
	}
	if !validRayLabel(LabelHost, h.ID) {
		delete(labels, LabelHost)
		skipped = append(skipped, fmt.Sprintf("%s=%s", LabelHost, h.ID))
	}
	return labels, skipped
}

// RayStartLabels renders labels as ray start's --labels value,
// "k1=v1,k2=v2", keys sorted.
func RayStartLabels(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + labels[k]
	}
	return strings.Join(parts, ",")
}

// Ray checks node labels with Kubernetes' syntax: an optional DNS-subdomain
// prefix and a name of at most 63 characters; values likewise, or empty.
var (
	labelName   = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?$`)
	labelPrefix = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
)

func validRayLabel(k, v string) bool {
	name := k
	if prefix, n, ok := strings.Cut(k, "/"); ok {
		if len(prefix) > 253 || !labelPrefix.MatchString(prefix) {
			return false
		}
		name = n
	}
	if !labelName.MatchString(name) || strings.ContainsAny(v, ",=") {
		return false
	}
	return v == "" || labelName.MatchString(v)
}
