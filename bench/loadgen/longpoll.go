package main

// longpoll mode: hold N long polls on one server, change that server once, and measure how
// long each waiter takes to hear of it, with /healthz probed in a closed loop meanwhile.
// Several service processes: comma-separated poll and metrics URLs, the waiters spread over
// the poll URLs in turn, and held once the metrics URLs' gauges add up to them.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

type longpollResult struct {
	Waiters       int     `json:"waiters"`
	Registered    int     `json:"registered"`
	Errors        int     `json:"errors"`
	Woken         int     `json:"woken"`
	WakeP50Ms     float64 `json:"wake_p50_ms"`
	WakeP99Ms     float64 `json:"wake_p99_ms"`
	WakeMaxMs     float64 `json:"wake_max_ms"`
	HealthP50Ms   float64 `json:"health_p50_ms"`
	HealthP99Ms   float64 `json:"health_p99_ms"`
	HealthSamples int     `json:"health_samples"`
	HealthErrors  int     `json:"health_errors"`
	FirstErr      string  `json:"first_error,omitempty"`
}

var waitersGauge = regexp.MustCompile(`(?m)^epochsvc_longpoll_waiters ([0-9.e+]+)$`)

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(p*float64(len(sorted)-1))].Microseconds()) / 1000
}

func runLongpoll(pollURLs, triggerURL, triggerBody, healthURL, metricsURLs, token string, waiters int) {
	polls := strings.Split(pollURLs, ",")
	gauges := strings.Split(metricsURLs, ",")
	dialer := &net.Dialer{Timeout: 30 * time.Second}
	transport := &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConnsPerHost: waiters + 16,
		MaxConnsPerHost:     0,
		IdleConnTimeout:     120 * time.Second,
	}
	client := &http.Client{Transport: transport, Timeout: 300 * time.Second}
	other := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	res := longpollResult{Waiters: waiters}
	var mu sync.Mutex
	fail := func(msg string) {
		mu.Lock()
		res.Errors++
		if res.FirstErr == "" {
			res.FirstErr = msg
		}
		mu.Unlock()
	}

	// /healthz in a closed loop for the whole run.
	ctx, stopHealth := context.WithCancel(context.Background())
	var health []time.Duration
	var hmu sync.Mutex
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		for ctx.Err() == nil {
			start := time.Now()
			resp, err := other.Get(healthURL)
			hmu.Lock()
			if err != nil {
				res.HealthErrors++
			} else {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				health = append(health, time.Since(start))
			}
			hmu.Unlock()
			time.Sleep(10 * time.Millisecond) // a probe's pace, not a load
		}
	}()

	var t0 time.Time
	var t0mu sync.RWMutex
	t0mu.Lock() // released when the change is sent
	wakes := make([]time.Duration, 0, waiters)
	var wg sync.WaitGroup
	dials := make(chan struct{}, 256) // connection set-up in bounded bursts, as replicas do
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		pollURL := polls[i%len(polls)]
		go func() {
			defer wg.Done()
			dials <- struct{}{}
			var once sync.Once
			release := func() { once.Do(func() { <-dials }) }
			trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { release() }}
			req, _ := http.NewRequestWithContext(
				httptrace.WithClientTrace(context.Background(), trace), "GET", pollURL, nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := client.Do(req)
			release()
			if err != nil {
				fail(err.Error())
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				fail(fmt.Sprintf("status %d", resp.StatusCode))
				return
			}
			t0mu.RLock()
			elapsed := time.Since(t0)
			t0mu.RUnlock()
			mu.Lock()
			wakes = append(wakes, elapsed)
			mu.Unlock()
		}()
	}

	// Until the service holds every waiter that did not fail.
	deadline := time.Now().Add(180 * time.Second)
	for time.Now().Before(deadline) {
		held, seen := 0.0, 0
		for _, metricsURL := range gauges {
			resp, err := other.Get(metricsURL)
			if err != nil {
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if m := waitersGauge.FindSubmatch(body); m != nil {
				n, _ := strconv.ParseFloat(string(m[1]), 64)
				held += n
				seen++
			}
		}
		if seen == len(gauges) {
			res.Registered = int(held)
			mu.Lock()
			errs := res.Errors
			mu.Unlock()
			if res.Registered >= waiters-errs {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	hmu.Lock()
	health = health[:0] // only what /healthz does while the waiters are held and woken
	res.HealthErrors = 0
	hmu.Unlock()

	req, _ := http.NewRequest("POST", triggerURL, bytes.NewBufferString(triggerBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	t0 = time.Now()
	t0mu.Unlock()
	if resp, err := other.Do(req); err != nil || resp.StatusCode/100 != 2 {
		fmt.Fprintf(os.Stderr, "trigger failed: %v\n", err)
		os.Exit(2)
	}
	wg.Wait()
	stopHealth()
	<-healthDone

	sort.Slice(wakes, func(a, b int) bool { return wakes[a] < wakes[b] })
	sort.Slice(health, func(a, b int) bool { return health[a] < health[b] })
	res.Woken = len(wakes)
	res.WakeP50Ms, res.WakeP99Ms = percentile(wakes, 0.5), percentile(wakes, 0.99)
	if len(wakes) > 0 {
		res.WakeMaxMs = float64(wakes[len(wakes)-1].Microseconds()) / 1000
	}
	res.HealthP50Ms, res.HealthP99Ms = percentile(health, 0.5), percentile(health, 0.99)
	res.HealthSamples = len(health)
	json.NewEncoder(os.Stdout).Encode(res)
}
