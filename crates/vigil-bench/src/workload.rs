//! The workloads, their settings, and the points each one measures.

use crate::matrix::{DecodeShape, MatrixCell};
use crate::traffic::TrafficShape;
use crate::BenchError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// One request at a time over a grid of prompt × output lengths.
    Single,
    /// N closed-loop streams at once.
    Concurrent,
    /// Long prompts, one output token: prompt tokens/s.
    Prefill,
    /// T turns on a P-token prefix, the conversation re-sent each turn.
    AgentLoop,
    /// The agent loop with tool definitions attached and a larger budget per turn.
    ToolLoop,
    /// Multi-turn workflows kept at a number in flight for a time window.
    Sustained,
    /// The same workflows, all dropped at once.
    Burst,
    /// A stream of entries pushed at a fixed cadence, queried as it grows: Flash Query and cold
    /// query on a session (where the target serves sessions), stateless replay everywhere.
    LiveStream,
    /// The speed-test matrix: prefill speed per context length, then sustained decode for a
    /// fixed time per (context × concurrency) cell.
    Matrix,
}

impl Workload {
    pub const ALL: [Workload; 9] = [
        Workload::Single,
        Workload::Concurrent,
        Workload::Prefill,
        Workload::AgentLoop,
        Workload::ToolLoop,
        Workload::LiveStream,
        Workload::Sustained,
        Workload::Burst,
        Workload::Matrix,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Single => "single",
            Workload::Concurrent => "concurrent",
            Workload::Prefill => "prefill",
            Workload::AgentLoop => "agent-loop",
            Workload::ToolLoop => "tool-loop",
            Workload::LiveStream => "live-stream",
            Workload::Sustained => "sustained",
            Workload::Burst => "burst",
            Workload::Matrix => "matrix",
        }
    }

    /// The endpoint the workload's requests go to.
    pub fn endpoint(self) -> &'static str {
        match self {
            Workload::Single | Workload::Concurrent | Workload::Prefill | Workload::Matrix => {
                "/v1/completions"
            }
            _ => "/v1/chat/completions",
        }
    }

    /// Whether its requests are chat conversations (calibrated on the chat endpoint).
    pub fn is_chat(self) -> bool {
        self.endpoint() == "/v1/chat/completions"
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                BenchError::Setting(format!(
                    "unknown workload `{s}` (one of single, concurrent, prefill, agent-loop, tool-loop, live-stream, sustained, burst, matrix)"
                ))
            })
    }
}

/// Every setting of a run, recorded in the result file (a field a file lacks takes its
/// default, so files written before a setting existed still read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Untimed requests (agent loop: loops) before each point.
    pub warmup: u32,
    /// Measured requests (agent loop: loops) per point; concurrent levels send at least 2 × N.
    pub iterations: u32,
    pub seed: u64,
    pub request_timeout_s: u64,
    /// single: prompt lengths × output lengths.
    pub prompt_tokens: Vec<u32>,
    pub output_tokens: Vec<u32>,
    /// concurrent: levels, and each stream's prompt and output length.
    pub concurrency: Vec<u32>,
    pub concurrent_prompt_tokens: u32,
    pub concurrent_output_tokens: u32,
    /// prefill: prompt lengths (1 output token).
    pub prefill_prompt_tokens: Vec<u32>,
    /// agent-loop: prefix lengths × turn counts, and tokens generated per turn.
    pub prefix_tokens: Vec<u32>,
    pub turns: Vec<u32>,
    pub turn_tokens: u32,
    /// tool-loop: tokens generated per turn (prefixes and turns as agent-loop).
    pub tool_turn_tokens: u32,
    /// agent-loop and tool-loop: also run each loop held in a session on targets that serve
    /// sessions (`x-layerscale-session-id`), beside the stateless re-send.
    pub session_loops: bool,
    /// sustained: workflows kept in flight, and the admission window in seconds; burst:
    /// workflows dropped at once. Each workflow is `workflow_turns` turns on a
    /// `workflow_prefix_tokens` first message, `workflow_turn_tokens` generated per turn.
    pub sustained_workflows: u32,
    pub window_s: u32,
    pub burst_workflows: u32,
    pub workflow_prefix_tokens: u32,
    pub workflow_turns: u32,
    pub workflow_turn_tokens: u32,
    /// live-stream: tokens per entry (about; each is counted by the target's tokenizer), the
    /// push period, the session window, and the answer length of every query.
    pub entry_tokens: u32,
    pub period_ms: u32,
    pub window_tokens: u32,
    pub answer_tokens: u32,
    /// live-stream: measured stateless replays and cold queries per target (default:
    /// `iterations`); on a CPU these take seconds each, flash answers milliseconds.
    pub replay_iterations: Option<u32>,
    pub cold_iterations: Option<u32>,
    /// live-stream: when in each period the queries fall due, in ms after the push (default:
    /// half the period, when the last push is usually resident; 0 lands each query on a push).
    pub query_offset_ms: Option<u32>,
    /// live-stream: chat streams kept running beside the stream on every target (closed loop,
    /// 64 tokens each request), to measure session work under a saturated engine.
    pub chat_streams: u32,
    /// live-stream: the session window's mode (Vigil: `exact`, `shift`); `None` sends none.
    /// With `shift`, the run ends by measuring its answer agreement with `exact`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_mode: Option<String>,
    /// matrix: context lengths (rows) and simultaneous requests (columns); each decode cell
    /// runs `matrix_duration_s` seconds of requests asking `matrix_max_output` tokens.
    pub matrix_contexts: Vec<u32>,
    pub matrix_concurrency: Vec<u32>,
    pub matrix_duration_s: u32,
    pub matrix_max_output: u32,
    /// What every request asks: temperature 0, `ignore_eos`, `min_tokens` = `max_tokens`.
    pub temperature: f64,
    pub ignore_eos: bool,
    pub min_tokens_equal_max_tokens: bool,
    /// The prefix-cache setting is the server's: recorded as given on the command line.
    pub prefix_cache: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            warmup: 3,
            iterations: 20,
            seed: 0,
            request_timeout_s: 900,
            prompt_tokens: vec![128, 1024],
            output_tokens: vec![128],
            concurrency: vec![1, 8, 32],
            concurrent_prompt_tokens: 512,
            concurrent_output_tokens: 128,
            prefill_prompt_tokens: vec![1024, 4096],
            prefix_tokens: vec![2048],
            turns: vec![5],
            turn_tokens: 48,
            tool_turn_tokens: 160,
            session_loops: true,
            sustained_workflows: 8,
            window_s: 60,
            burst_workflows: 16,
            workflow_prefix_tokens: 512,
            workflow_turns: 3,
            workflow_turn_tokens: 64,
            entry_tokens: 64,
            period_ms: 1000,
            window_tokens: 1024,
            answer_tokens: 16,
            replay_iterations: None,
            cold_iterations: None,
            query_offset_ms: None,
            chat_streams: 0,
            window_mode: None,
            matrix_contexts: vec![1024, 4096],
            matrix_concurrency: vec![1, 2, 4, 8],
            matrix_duration_s: 30,
            matrix_max_output: 512,
            temperature: 0.0,
            ignore_eos: true,
            min_tokens_equal_max_tokens: true,
            prefix_cache: "server default".to_string(),
        }
    }
}

/// What one point sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// `concurrency` closed-loop streams of `prompt_tokens` in, `max_tokens` out.
    Requests {
        prompt_tokens: u32,
        max_tokens: u32,
        concurrency: u32,
    },
    /// A conversation of `turns` turns on a `prefix_tokens` first request (tool definitions
    /// included when `tools`), re-sent each turn; `held` binds it to a session.
    AgentLoop {
        prefix_tokens: u32,
        turns: u32,
        turn_tokens: u32,
        tools: bool,
        held: bool,
    },
    /// One way of asking a question of a live stream.
    LiveStream { mode: LiveMode, stream: StreamShape },
    /// Workflows in flight over a window (sustained) or dropped at once (burst).
    Traffic(TrafficShape),
    /// A cell of the speed-test matrix: prefill at a context length, or sustained decode.
    Matrix(MatrixCell),
}

/// How a live-stream query is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveMode {
    /// A generate naming a flash query registered up front (sessions only).
    Flash,
    /// A generate of an unannounced question on the standing session (sessions only).
    Cold,
    /// A chat completion re-sending the windowed stream (every target).
    Replay,
    /// The same, opening with a line no other request shares, so no server's prompt or
    /// prefix cache holds any of it: what a replay costs when the cache does not hold the
    /// stream (other clients' prompts in between, a restart, another replica).
    ReplayUncached,
}

impl LiveMode {
    pub fn label(self) -> &'static str {
        match self {
            LiveMode::Flash => "flash query",
            LiveMode::Cold => "cold query",
            LiveMode::Replay => "stateless replay",
            LiveMode::ReplayUncached => "stateless replay, uncached",
        }
    }

    /// Whether the mode needs the target's session API.
    pub fn needs_sessions(self) -> bool {
        matches!(self, LiveMode::Flash | LiveMode::Cold)
    }
}

/// The stream every live-stream point runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamShape {
    pub entry_tokens: u32,
    pub period_ms: u32,
    pub window_tokens: u32,
    pub answer_tokens: u32,
    /// Queries fall due this long after a push.
    pub query_offset_ms: u32,
}

/// Room a live-stream query needs besides the window: system prompt, question, template.
pub const LIVE_QUERY_ROOM: u32 = 256;

#[derive(Debug, Clone, PartialEq)]
pub struct PlannedPoint {
    pub label: String,
    pub shape: Shape,
}

impl PlannedPoint {
    pub fn params(&self) -> BTreeMap<String, u64> {
        let pairs: Vec<(&str, u32)> = match self.shape {
            Shape::Requests {
                prompt_tokens,
                max_tokens,
                concurrency,
            } => vec![
                ("prompt_tokens", prompt_tokens),
                ("max_tokens", max_tokens),
                ("concurrency", concurrency),
            ],
            Shape::AgentLoop {
                prefix_tokens,
                turns,
                turn_tokens,
                tools,
                held,
            } => vec![
                ("prefix_tokens", prefix_tokens),
                ("turns", turns),
                ("turn_tokens", turn_tokens),
                ("tools", u32::from(tools)),
                ("session", u32::from(held)),
            ],
            Shape::LiveStream { stream: s, .. } => vec![
                ("entry_tokens", s.entry_tokens),
                ("period_ms", s.period_ms),
                ("window_tokens", s.window_tokens),
                ("answer_tokens", s.answer_tokens),
            ],
            Shape::Traffic(t) => vec![
                ("workflows", t.workflows),
                ("window_s", t.window_s),
                ("prefix_tokens", t.prefix_tokens),
                ("turns", t.turns),
                ("turn_tokens", t.turn_tokens),
            ],
            Shape::Matrix(MatrixCell::Prefill { context }) => {
                vec![("context", context), ("max_tokens", 1), ("concurrency", 1)]
            }
            Shape::Matrix(MatrixCell::Decode(d)) => vec![
                ("context", d.context),
                ("concurrency", d.concurrency),
                ("duration_s", d.duration_s),
                ("max_tokens", d.max_tokens),
            ],
        };
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), u64::from(v)))
            .collect()
    }

    /// The longest prompt the point sends and the tokens it generates after it: what must fit
    /// in the target's context.
    pub fn context_need(&self) -> u32 {
        match self.shape {
            Shape::Requests {
                prompt_tokens,
                max_tokens,
                ..
            } => prompt_tokens + max_tokens,
            // Each later turn adds the reply and a short user message (under 16 tokens).
            Shape::AgentLoop {
                prefix_tokens,
                turns,
                turn_tokens,
                ..
            } => prefix_tokens + turns * (turn_tokens + 16),
            Shape::LiveStream { stream: s, .. } => {
                s.window_tokens + s.answer_tokens + LIVE_QUERY_ROOM
            }
            Shape::Traffic(t) => t.prefix_tokens + t.turns * (t.turn_tokens + 16),
            Shape::Matrix(MatrixCell::Prefill { context }) => context + 1,
            Shape::Matrix(MatrixCell::Decode(d)) => d.context + d.max_tokens,
        }
    }

    /// Whether a point too large for the target is recorded as over capacity (a matrix cell)
    /// rather than refused before the run.
    pub fn marks_over_capacity(&self) -> bool {
        matches!(self.shape, Shape::Matrix(_))
    }

    /// Whether the point runs only on targets that serve sessions.
    pub fn needs_sessions(&self) -> bool {
        match self.shape {
            Shape::AgentLoop { held, .. } => held,
            Shape::LiveStream { mode, .. } => mode.needs_sessions(),
            Shape::Requests { .. } | Shape::Traffic(_) | Shape::Matrix(_) => false,
        }
    }

    /// Measured requests of a point (closed loop: at least two per stream; live-stream replay:
    /// `replay_iterations` where set).
    pub fn measured_requests(&self, s: &Settings) -> u32 {
        match self.shape {
            Shape::Requests { concurrency, .. } if concurrency > 1 => {
                s.iterations.max(2 * concurrency)
            }
            Shape::LiveStream {
                mode: LiveMode::Replay | LiveMode::ReplayUncached,
                ..
            } => s.replay_iterations.unwrap_or(s.iterations),
            Shape::LiveStream {
                mode: LiveMode::Cold,
                ..
            } => s.cold_iterations.unwrap_or(s.iterations),
            _ => s.iterations,
        }
    }
}

/// The points of `workload` under `settings`, in run order.
pub fn plan(workload: Workload, s: &Settings) -> Result<Vec<PlannedPoint>, BenchError> {
    let nonzero = |what: &str, v: &[u32]| {
        if v.is_empty() || v.contains(&0) {
            Err(BenchError::Setting(format!(
                "{what} must list positive numbers"
            )))
        } else {
            Ok(())
        }
    };
    if s.iterations == 0 {
        return Err(BenchError::Setting("iterations must be at least 1".into()));
    }
    let points = match workload {
        Workload::Single => {
            nonzero("prompt tokens", &s.prompt_tokens)?;
            nonzero("output tokens", &s.output_tokens)?;
            let mut v = Vec::new();
            for &p in &s.prompt_tokens {
                for &o in &s.output_tokens {
                    v.push(PlannedPoint {
                        label: format!("in={p} out={o}"),
                        shape: Shape::Requests {
                            prompt_tokens: p,
                            max_tokens: o,
                            concurrency: 1,
                        },
                    });
                }
            }
            v
        }
        Workload::Concurrent => {
            nonzero("concurrency", &s.concurrency)?;
            nonzero(
                "concurrent prompt/output tokens",
                &[s.concurrent_prompt_tokens, s.concurrent_output_tokens],
            )?;
            s.concurrency
                .iter()
                .map(|&c| PlannedPoint {
                    label: format!("c={c}"),
                    shape: Shape::Requests {
                        prompt_tokens: s.concurrent_prompt_tokens,
                        max_tokens: s.concurrent_output_tokens,
                        concurrency: c,
                    },
                })
                .collect()
        }
        Workload::Prefill => {
            nonzero("prefill prompt tokens", &s.prefill_prompt_tokens)?;
            s.prefill_prompt_tokens
                .iter()
                .map(|&p| PlannedPoint {
                    label: format!("in={p}"),
                    shape: Shape::Requests {
                        prompt_tokens: p,
                        max_tokens: 1,
                        concurrency: 1,
                    },
                })
                .collect()
        }
        Workload::AgentLoop | Workload::ToolLoop => {
            let tools = workload == Workload::ToolLoop;
            let turn_tokens = if tools {
                s.tool_turn_tokens
            } else {
                s.turn_tokens
            };
            nonzero("prefix tokens", &s.prefix_tokens)?;
            nonzero("turns", &s.turns)?;
            nonzero("turn tokens", &[turn_tokens])?;
            let held = if s.session_loops {
                &[false, true][..]
            } else {
                &[false][..]
            };
            let mut v = Vec::new();
            for &p in &s.prefix_tokens {
                for &t in &s.turns {
                    for &held in held {
                        v.push(PlannedPoint {
                            label: format!("P={p} T={t}{}", if held { " session" } else { "" }),
                            shape: Shape::AgentLoop {
                                prefix_tokens: p,
                                turns: t,
                                turn_tokens,
                                tools,
                                held,
                            },
                        });
                    }
                }
            }
            v
        }
        Workload::LiveStream => {
            nonzero(
                "live-stream entry/period/window/answer",
                &[
                    s.entry_tokens,
                    s.period_ms,
                    s.window_tokens,
                    s.answer_tokens,
                ],
            )?;
            if s.replay_iterations == Some(0) || s.cold_iterations == Some(0) {
                return Err(BenchError::Setting(
                    "replay and cold iterations must be at least 1".into(),
                ));
            }
            if s.window_tokens < 2 * s.entry_tokens {
                return Err(BenchError::Setting(format!(
                    "a {}-token window holds fewer than two {}-token entries",
                    s.window_tokens, s.entry_tokens
                )));
            }
            let query_offset_ms = s.query_offset_ms.unwrap_or(s.period_ms / 2);
            if query_offset_ms >= s.period_ms {
                return Err(BenchError::Setting(format!(
                    "the query offset ({query_offset_ms} ms) must be less than the period ({} ms)",
                    s.period_ms
                )));
            }
            let stream = StreamShape {
                entry_tokens: s.entry_tokens,
                period_ms: s.period_ms,
                window_tokens: s.window_tokens,
                answer_tokens: s.answer_tokens,
                query_offset_ms,
            };
            [
                LiveMode::Flash,
                LiveMode::Cold,
                LiveMode::Replay,
                LiveMode::ReplayUncached,
            ]
            .into_iter()
            .map(|mode| PlannedPoint {
                label: mode.label().to_string(),
                shape: Shape::LiveStream { mode, stream },
            })
            .collect()
        }
        Workload::Sustained | Workload::Burst => {
            let burst = workload == Workload::Burst;
            let workflows = if burst {
                s.burst_workflows
            } else {
                s.sustained_workflows
            };
            let window_s = if burst { 0 } else { s.window_s };
            nonzero(
                "workflows, window, workflow prefix/turns/turn tokens",
                &[
                    workflows,
                    if burst { 1 } else { window_s },
                    s.workflow_prefix_tokens,
                    s.workflow_turns,
                    s.workflow_turn_tokens,
                ],
            )?;
            let label = if burst {
                format!("burst={workflows}")
            } else {
                format!("in-flight={workflows} window={window_s}s")
            };
            vec![PlannedPoint {
                label,
                shape: Shape::Traffic(TrafficShape {
                    workflows,
                    window_s,
                    prefix_tokens: s.workflow_prefix_tokens,
                    turns: s.workflow_turns,
                    turn_tokens: s.workflow_turn_tokens,
                }),
            }]
        }
        Workload::Matrix => {
            nonzero("matrix contexts", &s.matrix_contexts)?;
            nonzero("matrix concurrency", &s.matrix_concurrency)?;
            nonzero(
                "matrix duration and max output",
                &[s.matrix_duration_s, s.matrix_max_output],
            )?;
            matrix_points(s)
        }
    };
    Ok(points)
}

/// Prefill at each context, then the decode cells, a row per context (both ascending): a cell
/// is skipped when a lower concurrency of its row failed, so each row runs in rising order.
fn matrix_points(s: &Settings) -> Vec<PlannedPoint> {
    let sorted = |v: &[u32]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (contexts, levels) = (sorted(&s.matrix_contexts), sorted(&s.matrix_concurrency));
    let prefill = contexts.iter().map(|&context| PlannedPoint {
        label: format!("prefill ctx={context}"),
        shape: Shape::Matrix(MatrixCell::Prefill { context }),
    });
    let decode = contexts.iter().flat_map(|&context| {
        levels.iter().map(move |&concurrency| PlannedPoint {
            label: format!("ctx={context} c={concurrency}"),
            shape: Shape::Matrix(MatrixCell::Decode(DecodeShape {
                context,
                concurrency,
                duration_s: s.matrix_duration_s,
                max_tokens: s.matrix_max_output,
            })),
        })
    });
    prefill.chain(decode).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_follow_the_settings() {
        let s = Settings::default();
        let single = plan(Workload::Single, &s).unwrap();
        assert_eq!(
            single.iter().map(|p| p.label.as_str()).collect::<Vec<_>>(),
            ["in=128 out=128", "in=1024 out=128"]
        );
        let conc = plan(Workload::Concurrent, &s).unwrap();
        assert_eq!(conc.len(), 3);
        assert_eq!(conc[2].measured_requests(&s), 64);
        assert_eq!(conc[0].measured_requests(&s), 20);
        let agent = plan(Workload::AgentLoop, &s).unwrap();
        assert_eq!(agent[0].params()["turns"], 5);
        assert_eq!(agent[0].context_need(), 2048 + 5 * 64);
        assert_eq!(
            agent.iter().map(|p| p.label.as_str()).collect::<Vec<_>>(),
            ["P=2048 T=5", "P=2048 T=5 session"]
        );
        assert_eq!(agent[1].params()["session"], 1);
        let tools = plan(Workload::ToolLoop, &s).unwrap();
        assert_eq!(tools[0].params()["turn_tokens"], 160);
        assert_eq!(tools[0].params()["tools"], 1);
        let stateless = Settings {
            session_loops: false,
            ..Settings::default()
        };
        assert_eq!(plan(Workload::ToolLoop, &stateless).unwrap().len(), 1);
        let bad = Settings {
            concurrency: vec![0],
            ..Settings::default()
        };
        assert!(plan(Workload::Concurrent, &bad).is_err());
        assert_eq!(
            "agent-loop".parse::<Workload>().unwrap(),
            Workload::AgentLoop
        );
        assert!("matrices".parse::<Workload>().is_err());
    }

    #[test]
    fn live_stream_plans_three_modes_on_one_stream() {
        let s = Settings {
            replay_iterations: Some(5),
            cold_iterations: Some(4),
            ..Settings::default()
        };
        let live = plan(Workload::LiveStream, &s).unwrap();
        let labels: Vec<&str> = live.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "flash query",
                "cold query",
                "stateless replay",
                "stateless replay, uncached"
            ]
        );
        assert_eq!(live[0].measured_requests(&s), 20);
        assert_eq!(live[1].measured_requests(&s), 4);
        assert_eq!(live[2].measured_requests(&s), 5);
        assert_eq!(live[2].params()["window_tokens"], 1024);
        assert_eq!(live[1].context_need(), 1024 + 16 + LIVE_QUERY_ROOM);
        let narrow = Settings {
            window_tokens: 100,
            ..Settings::default()
        };
        assert!(plan(Workload::LiveStream, &narrow).is_err());
        assert_eq!(
            "live-stream".parse::<Workload>().unwrap(),
            Workload::LiveStream
        );
    }

    #[test]
    fn matrix_plans_prefill_then_rows_of_decode_cells() {
        let s = Settings {
            matrix_contexts: vec![4096, 1024, 1024],
            matrix_concurrency: vec![4, 1],
            matrix_duration_s: 5,
            matrix_max_output: 64,
            ..Settings::default()
        };
        let m = plan(Workload::Matrix, &s).unwrap();
        let labels: Vec<&str> = m.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "prefill ctx=1024",
                "prefill ctx=4096",
                "ctx=1024 c=1",
                "ctx=1024 c=4",
                "ctx=4096 c=1",
                "ctx=4096 c=4"
            ]
        );
        assert_eq!(m[1].context_need(), 4097);
        assert_eq!(m[1].params()["context"], 4096);
        assert_eq!(m[1].params()["max_tokens"], 1);
        assert_eq!(m[1].measured_requests(&s), 20);
        assert_eq!(m[5].context_need(), 4096 + 64);
        assert_eq!(m[5].params()["concurrency"], 4);
        assert_eq!(m[5].params()["duration_s"], 5);
        assert!(m.iter().all(PlannedPoint::marks_over_capacity));
        assert!(!plan(Workload::Single, &s).unwrap()[0].marks_over_capacity());
        let no_time = Settings {
            matrix_duration_s: 0,
            ..s
        };
        assert!(plan(Workload::Matrix, &no_time).is_err());
        assert_eq!("matrix".parse::<Workload>().unwrap(), Workload::Matrix);
    }
}
