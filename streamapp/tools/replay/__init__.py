"""Record and replay topics: the file format (format), recording topics or a synthetic pipeline
(capture), scenario transforms (transforms) and scenario files (scenario), the join's expected
outcome (predict), publishing at the recorded pace (publish), and the two commands (commands)."""
