// loadgen drives one HTTP endpoint with a fixed number of closed-loop clients for a fixed time
// and prints throughput and latency percentiles as JSON. It is written in Go so that the load
// generator costs far less CPU than the Python service it measures on a two-core machine.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// headerFlags collects repeated -header "Name: value" flags.
type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

type result struct {
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	PerSec   float64 `json:"per_sec"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	FirstErr string  `json:"first_error,omitempty"`
}

func main() {
	method := flag.String("method", "GET", "HTTP method")
	urls := flag.String("urls", "", "comma-separated URLs, used round-robin; {n} becomes a unique counter")
	body := flag.String("body", "", "request body; {n} becomes a unique counter")
	token := flag.String("token", "", "bearer token")
	clients := flag.Int("c", 1, "concurrent clients")
	duration := flag.Duration("d", 3*time.Second, "how long to run")
	want := flag.Int("status", 0, "expected status (0: any 2xx)")
	prefix := flag.String("prefix", strconv.FormatInt(time.Now().UnixNano(), 36), "unique prefix for {n}")
	mode := flag.String("mode", "load", "load (closed-loop clients) or longpoll")
	waiters := flag.Int("waiters", 1000, "longpoll: long polls held at once")
	trigger := flag.String("trigger", "", "longpoll: URL POSTed (with -body) to change the server")
	health := flag.String("health", "", "longpoll: URL probed meanwhile")
	metrics := flag.String("metrics", "", "longpoll: the service's /metrics (waiters held)")
	var headers headerFlags
	flag.Var(&headers, "header", "extra request header \"Name: value\" (repeatable)")
	whole := flag.Bool("whole", false, "time each request until its body is read (streams)")
	flag.Parse()
	if *mode == "longpoll" {
		runLongpoll(*urls, *trigger, *body, *health, *metrics, *token, *waiters)
		return
	}
	targets := strings.Split(*urls, ",")

	transport := &http.Transport{MaxIdleConnsPerHost: *clients * 2, MaxConnsPerHost: *clients * 2}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	var counter atomic.Int64
	var mu sync.Mutex
	var latencies []time.Duration
	errors := 0
	firstErr := ""
	deadline := time.Now().Add(*duration)
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			localErr := 0
			msg := ""
			for time.Now().Before(deadline) {
				n := counter.Add(1)
				id := *prefix + "-" + strconv.FormatInt(n, 10)
				url := strings.ReplaceAll(targets[int(n)%len(targets)], "{n}", id)
				var rdr io.Reader
				if *body != "" {
					rdr = bytes.NewBufferString(strings.ReplaceAll(*body, "{n}", id))
				}
				req, _ := http.NewRequest(*method, url, rdr)
				if *body != "" {
					req.Header.Set("Content-Type", "application/json")
				}
				if *token != "" {
					req.Header.Set("Authorization", "Bearer "+*token)
				}
				for _, h := range headers {
					name, value, _ := strings.Cut(h, ":")
					req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
				}
				start := time.Now()
				resp, err := client.Do(req)
				elapsed := time.Since(start)
				if err != nil {
					localErr++
					if msg == "" {
						msg = err.Error()
					}
					continue
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if *whole {
					elapsed = time.Since(start)
				}
				ok := resp.StatusCode/100 == 2
				if *want != 0 {
					ok = resp.StatusCode == *want
				}
				if !ok {
					localErr++
					if msg == "" {
						msg = fmt.Sprintf("%d %s", resp.StatusCode, data)
					}
					continue
				}
				local = append(local, elapsed)
			}
			mu.Lock()
			latencies = append(latencies, local...)
			errors += localErr
			if firstErr == "" {
				firstErr = msg
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Slice(latencies, func(a, b int) bool { return latencies[a] < latencies[b] })
	pct := func(p float64) float64 {
		if len(latencies) == 0 {
			return 0
		}
		idx := int(p * float64(len(latencies)-1))
		return float64(latencies[idx].Microseconds()) / 1000
	}
	out := result{
		Requests: len(latencies),
		Errors:   errors,
		PerSec:   float64(len(latencies)) / duration.Seconds(),
		P50Ms:    pct(0.50),
		P99Ms:    pct(0.99),
		FirstErr: firstErr,
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
