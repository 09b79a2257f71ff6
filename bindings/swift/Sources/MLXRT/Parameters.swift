import CMLXRT

/// Engine settings. Defaults are the C library's (`mlxrt_engine_config_init`).
public struct EngineConfiguration: Sendable {
    public enum Device: Int32, Sendable {
        case automatic = 0  // the GPU where present
        case cpu = 1
        case gpu = 2
    }

    /// A `.gguf` file or a Hugging Face MLX-format folder.
    public var modelPath: String
    public var device: Device
    /// Requests accepted but not finished before generate fails with `.busy`.
    public var maxInFlight: UInt32
    /// Requests batched together; the rest wait in FIFO order.
    public var maxRows: UInt32
    public var prefillChunk: UInt32
    public var kvBudget: UInt64
    /// Base seed for requests without their own.
    public var seed: UInt64
    /// Bytes of prompt-cache snapshots kept in memory; 0 turns the cache off.
    public var promptCacheBytes: UInt64
    /// Where the prompt cache persists across restarts; nil = memory only.
    public var promptCacheDirectory: String?

    public init(modelPath: String) {
        var c = mlxrt_engine_config()
        mlxrt_engine_config_init(&c)
        self.modelPath = modelPath
        device = Device(rawValue: c.device) ?? .automatic
        maxInFlight = c.max_in_flight
        maxRows = c.max_rows
        prefillChunk = c.prefill_chunk
        kvBudget = c.kv_budget
        seed = c.seed
        promptCacheBytes = c.prompt_cache_bytes
        promptCacheDirectory = nil
    }
}

/// One chat message.
public struct Message: Sendable, Hashable, Codable {
    public var role: String
    public var content: String

    public init(role: String, content: String) {
        self.role = role
        self.content = content
    }

    public static func system(_ content: String) -> Message { Message(role: "system", content: content) }
    public static func user(_ content: String) -> Message { Message(role: "user", content: content) }
    public static func assistant(_ content: String) -> Message { Message(role: "assistant", content: content) }
}

/// Sampling and limits of one request. Defaults are the C library's
/// (`mlxrt_request_params_init`): greedy, 256 tokens.
public struct GenerateParameters: Sendable {
    public var maxTokens: UInt32
    /// 0 = greedy.
    public var temperature: Float
    /// 0 = off.
    public var topP: Float
    /// 0 = off.
    public var topK: Int32
    /// 0 = off.
    public var minP: Float
    /// 1 = off.
    public var repetitionPenalty: Float
    /// Makes sampling reproducible; nil = the engine's seed sequence.
    public var seed: UInt64?
    /// Generation stops when one appears in the text, which ends before it.
    public var stop: [String]
    /// OpenAI-style fields as a JSON object, applied after the fields above
    /// (e.g. `{"ignore_eos": true}`).
    public var optionsJSON: String?
    /// Prompt-cache namespace: cached state is shared only within one.
    public var cacheNamespace: String?
    /// false: this request neither uses nor fills the prompt cache.
    public var usesPromptCache: Bool
    /// For models with a thinking mode: think or not; nil = the template's default.
    public var thinking: Bool?

    public init() {
        var p = mlxrt_request_params()
        mlxrt_request_params_init(&p)
        maxTokens = p.max_tokens
        temperature = p.temperature
        topP = p.top_p
        topK = p.top_k
        minP = p.min_p
        repetitionPenalty = p.repetition_penalty
        seed = nil
        stop = []
        optionsJSON = nil
        cacheNamespace = nil
        usesPromptCache = p.no_prompt_cache == 0
        thinking = nil
    }
}

/// Why a request ended.
public enum FinishReason: Int32, Sendable {
    /// An end-of-sequence token or a stop string.
    case stop = 1
    /// `maxTokens` or the model's context length.
    case length = 2
    /// The stream was terminated (or its task cancelled) before the end.
    case cancelled = 3
    /// The model ended its turn after calling tools (`.toolCall` events).
    case toolCalls = 4
}

/// Token counts and timings of a finished request.
public struct Usage: Sendable, Equatable {
    public var promptTokens: Int
    /// Prompt tokens served from the prompt cache.
    public var cachedTokens: Int
    public var completionTokens: Int
    /// Seconds from submission to the first generated token.
    public var timeToFirstToken: Double
    public var prefillTokensPerSecond: Double
    public var decodeTokensPerSecond: Double

    init(_ u: mlxrt_usage) {
        promptTokens = Int(u.prompt_tokens)
        cachedTokens = Int(u.cached_tokens)
        completionTokens = Int(u.completion_tokens)
        timeToFirstToken = u.ttft_ms / 1000
        prefillTokensPerSecond = u.prefill_tokens_per_s
        decodeTokensPerSecond = u.decode_tokens_per_s
    }
}

/// A tool call the model made; `arguments` is a JSON object.
public struct ToolCall: Sendable, Equatable {
    public var id: String
    public var name: String
    public var arguments: String
}

/// What a generation stream yields: any number of `.text`, `.reasoning` and
/// `.toolCall`, then one `.done` (or the stream throws an `MLXRTError`).
public enum Event: Sendable, Equatable {
    /// New answer text (complete UTF-8) and the ids of the tokens it came from.
    case text(String, tokens: [UInt32])
    /// New thinking text, for models that think.
    case reasoning(String, tokens: [UInt32])
    case toolCall(ToolCall)
    case done(FinishReason, Usage)
}
