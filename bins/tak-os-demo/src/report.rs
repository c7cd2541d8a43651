//! The demo's output: one line per step with its duration, details indented below it, and a
//! final `PASS` or `FAIL` line.

use std::fmt;
use std::io::Write;
use std::time::Instant;

/// Width of the `[  12.3 ms] ` prefix, for indenting details under the description.
const INDENT: &str = "             ";

/// What a step produced, plus lines that describe it.
#[derive(Debug)]
pub struct Done<T> {
    value: T,
    details: Vec<String>,
}

impl<T> Done<T> {
    /// A step's result without details.
    pub fn new(value: T) -> Self {
        Done {
            value,
            details: Vec::new(),
        }
    }

    /// The same lines with the value changed by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Done<U> {
        Done {
            value: f(self.value),
            details: self.details,
        }
    }

    /// The value and the lines.
    pub fn into_parts(self) -> (T, Vec<String>) {
        (self.value, self.details)
    }

    /// Adds a line describing the result.
    #[must_use]
    pub fn detail(mut self, line: impl Into<String>) -> Self {
        self.details.push(line.into());
        self
    }
}

impl Done<()> {
    /// A step that produced nothing but this line.
    pub fn said(line: impl Into<String>) -> Self {
        Done::new(()).detail(line)
    }
}

/// The step that failed and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The step's description.
    pub step: String,
    /// Why it failed.
    pub reason: String,
}

impl Failure {
    /// A failure of `step`.
    pub fn new(step: impl Into<String>, reason: impl fmt::Display) -> Self {
        Failure {
            step: step.into(),
            reason: reason.to_string(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.step, self.reason)
    }
}

/// Prints steps as they finish. Output errors are ignored: a closed stdout must not stop the
/// cleanup that follows.
pub struct Report<'w> {
    out: &'w mut dyn Write,
    steps: usize,
    started: Instant,
}

impl fmt::Debug for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Report")
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl<'w> Report<'w> {
    /// A report written to `out`; the total time counts from here.
    pub fn new(out: &'w mut dyn Write) -> Self {
        Report {
            out,
            steps: 0,
            started: Instant::now(),
        }
    }

    /// Runs one asynchronous step and prints its line.
    pub async fn step<T>(
        &mut self,
        description: &str,
        work: impl Future<Output = Result<Done<T>, String>>,
    ) -> Result<T, Failure> {
        let start = Instant::now();
        let result = work.await;
        self.finish(description, start, result)
    }

    /// Runs one synchronous step and prints its line.
    pub fn sync_step<T>(
        &mut self,
        description: &str,
        work: impl FnOnce() -> Result<Done<T>, String>,
    ) -> Result<T, Failure> {
        let start = Instant::now();
        let result = work();
        self.finish(description, start, result)
    }

    fn finish<T>(
        &mut self,
        description: &str,
        start: Instant,
        result: Result<Done<T>, String>,
    ) -> Result<T, Failure> {
        let ms = start.elapsed().as_secs_f64() * 1e3;
        self.steps += 1;
        match result {
            Ok(done) => {
                self.say(format_args!("[{ms:>7.1} ms] {description} ... ok"));
                for line in &done.details {
                    self.say(format_args!("{INDENT}{line}"));
                }
                Ok(done.value)
            }
            Err(reason) => {
                self.say(format_args!("[{ms:>7.1} ms] {description} ... FAIL"));
                self.say(format_args!("{INDENT}{reason}"));
                Err(Failure::new(description, reason))
            }
        }
    }

    /// Prints one line as it is.
    pub fn say(&mut self, line: fmt::Arguments<'_>) {
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
    }

    /// Prints the final line: `PASS (N steps, total X ms)` or `FAIL: <step>: <reason>`.
    pub fn conclude(&mut self, failure: Option<&Failure>) {
        match failure {
            None => {
                let ms = self.started.elapsed().as_secs_f64() * 1e3;
                let steps = self.steps;
                self.say(format_args!("PASS ({steps} steps, total {ms:.1} ms)"));
            }
            Some(failure) => self.say(format_args!("FAIL: {failure}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).unwrap_or_default()
    }

    #[test]
    fn steps_print_duration_description_and_details() {
        let mut out = Vec::new();
        let mut report = Report::new(&mut out);
        let value = report.sync_step("first", || Ok(Done::new(7).detail("seven")));
        assert_eq!(value, Ok(7));
        let failed = report.sync_step::<()>("second", || Err("broken".to_owned()));
        assert_eq!(failed, Err(Failure::new("second", "broken")));
        report.conclude(failed.err().as_ref());
        let text = text(out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[0].starts_with('[') && lines[0].ends_with(" ms] first ... ok"));
        assert_eq!(lines[1], format!("{INDENT}seven"));
        assert!(lines[2].ends_with(" ms] second ... FAIL"));
        assert_eq!(lines[3], format!("{INDENT}broken"));
        assert_eq!(lines[4], "FAIL: second: broken");
    }

    #[test]
    fn pass_counts_steps() {
        let mut out = Vec::new();
        let mut report = Report::new(&mut out);
        for _ in 0..3 {
            let _ = report.sync_step("x", || Ok(Done::new(())));
        }
        report.conclude(None);
        let text = text(out);
        let last = text.lines().last().unwrap_or_default();
        assert!(last.starts_with("PASS (3 steps, total "), "{last}");
        assert!(last.ends_with(" ms)"), "{last}");
    }
}
