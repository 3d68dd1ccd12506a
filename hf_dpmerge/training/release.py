"""The release half of :class:`~hf_dpmerge.training.dpsam_trainer.DPSAMTrainer`: :class:`ReleaseMixin`.

What a run releases and how: its privacy record (``dp_privacy.json``: what it has spent so far), ``save_model``
(a checkpoint, or an atomic release of the allow-listed files with the noise statistics, the record and the card:
:func:`~hf_dpmerge.records.release_files.release_adapter`) and, under DP, ``push_to_hub`` of that release only
(docs/design.md §10, docs/privacy.md).
"""

from __future__ import annotations

import copy
import math
import os
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

from transformers.utils import hf_api

from hf_dpmerge.data.model_path import source_hub_id
from hf_dpmerge.modeling.mean_pooling import CLASSIFIER_POOLING_KEY
from hf_dpmerge.modeling.stock_release import save_stock_classifier
from hf_dpmerge.noise.collection import write_noise_stats
from hf_dpmerge.records.card import write_adapter_card
from hf_dpmerge.records.fingerprint import base_fingerprint, peft_base_tensors
from hf_dpmerge.records.record import ADD_REMOVE_ONE, PrivacyRecord, privacy_unit_name
from hf_dpmerge.records.release_files import check_finite_weights, release_adapter
from hf_dpmerge.records.statement import check_unseeded_release
from hf_dpmerge.training.shared_lora_a import frozen_lora_a_record
from hf_dpmerge.utils.adapter_files import set_adapter_base


class ReleaseMixin:
    """``privacy_record``, ``save_model`` and ``push_to_hub`` of a ``transformers.Trainer`` subclass holding the DP
    state of :class:`~hf_dpmerge.training.dpsam_trainer.DPSAMTrainer` (listed before ``Trainer`` among its bases)."""

    def privacy_record(self) -> PrivacyRecord:
        """The record of what this run has spent so far."""
        args = self.args
        peft_config = getattr(self.model, "peft_config", {})
        adapter_config = next(iter(peft_config.values()), None)
        base_tensors = peft_base_tensors(self.model)
        optimizer = self.optimizer
        hyper = {}
        if optimizer is not None:
            hyper = {
                k: (list(v) if isinstance(v, tuple) else v)
                for k, v in optimizer.param_groups[0].items()
                if k in ("betas", "eps", "weight_decay", "momentum", "nesterov", "dampening")
            }
        optimizer_info = {
            "name": type(getattr(optimizer, "optimizer", optimizer)).__name__ if optimizer is not None else args.optim,
            "lr": args.learning_rate,
            "head_lr": args.head_learning_rate if args.head_learning_rate is not None else args.learning_rate,
            "lr_scheduler": str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)),  # "linear"
            **hyper,
        }
        accountant = self.dp_state.accountant
        dp = accountant is not None
        return PrivacyRecord(
            epsilon=accountant.epsilon() if dp else math.inf,
            delta=self.delta if dp else 0.0,
            accountant=args.accountant if dp else "none",
            noise_multiplier=self.noise_multiplier if dp else 0.0,
            effective_noise_multiplier=self.effective_noise_multiplier if dp else 0.0,
            sample_rate=self.sample_rate,
            steps=self.state.global_step,
            max_grad_norm=1.0 if args.clipping == "automatic" else args.per_sample_max_grad_norm,  # sensitivity
            expected_batch_size=self.expected_batch_size,
            num_samples=self.num_samples,
            privacy_unit=privacy_unit_name(args.privacy_unit_column),
            num_units=self.num_units,
            neighbouring_relation=ADD_REMOVE_ONE,
            epsilon_replace_one=accountant.epsilon_replace_one() if dp else None,
            sam_mode=args.sam_mode,
            sam_rho=args.sam_rho,
            align_lambda=self.align_lambda,
            optimizer=optimizer_info,
            sum_lr_squared=self.dp_state.sum_lr_squared,
            base_model=self._base_hub_id(adapter_config),
            base_model_hash=base_fingerprint(base_tensors) if base_tensors else None,
            base_model_hash_tensors=sorted(base_tensors),
            versions={pkg: version(pkg) for pkg in ("hf_dpmerge", "torch", "transformers", "peft", "opacus")},
            dp=dp,
            queries_per_step=self.queries_per_step,
            seeded=True if args.dp_seed is not None else self.dp_state.seeded_before_resume,
            eval_data_is_public=args.eval_data_is_public,
            resumed_from_steps=list(self.dp_state.resumed_from_steps),
            extra=self._record_extra(),
        )

    @staticmethod
    def _base_hub_id(adapter_config: Any) -> str | None:
        """The base's Hub id (a release never names a path of the training machine), None for a local base of
        unknown origin."""
        source = getattr(adapter_config, "base_model_name_or_path", None)
        return source_hub_id(source) if source else None

    def _record_extra(self) -> dict[str, Any]:
        """The record's ``extra``: the options of docs/design.md §15 this run used."""
        extra: dict[str, Any] = {}
        if lora_a := frozen_lora_a_record(self.model):
            extra["lora_a"] = lora_a
        if warmup_steps := self.args.head_warmup_step_count(self.state.max_steps):
            extra["head_warmup_steps"] = warmup_steps
        if self.args.clipping == "automatic":
            extra["clipping"] = {"mode": "automatic", "gamma": self.args.clipping_gamma}
        if self.args.proximal_mu > 0:
            extra["proximal_mu"] = self.args.proximal_mu
        if self.anchor_lambda > 0:
            extra["public_anchor"] = {"lambda": self.anchor_lambda, "rows": len(self.anchor_rows),
                                      "privacy": "public prompts and the weights only: its gradient is added after "
                                                 "the noise (no privacy cost)"}
        if self.iterate_average is not None:
            extra["iterate_average"] = {"last_steps": self.args.average_last_steps,
                                        "iterates": self.iterate_average.count}
        if self.earlier_phases and self.dp_state.accountant is not None:
            extra["phases"] = [*self.earlier_phases, self.privacy_phase("lora")]
        return extra

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False, overwrite: bool = False) -> None:
        """Save the adapter with its ``dp_privacy.json``: into a checkpoint (with ``dp_state.pt``) when the
        Trainer checkpoints, else as a release (atomic; finite weights only; replacing one needs ``overwrite``)."""
        output_dir = output_dir or self.args.output_dir
        if _internal_call:  # a checkpoint, or push_to_hub's save
            super().save_model(output_dir, _internal_call)
            if self.args.should_save:
                self.privacy_record().save(output_dir)
                self.dp_state.save_checkpoint(output_dir, self.state.global_step)
            return
        check_finite_weights(self._param_names, self._params)
        if not self.args.should_save:  # non-writer ranks take part in gathering the weights, write nothing
            super().save_model(output_dir)
            return
        name = self._card_name(output_dir)
        release_adapter(output_dir, lambda directory: self._write_release(directory, name), overwrite)
        if self.args.push_to_hub:  # as Trainer.save_model does when the user saves
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _card_name(self, target: str | os.PathLike) -> str:
        return (self.args.hub_model_id or Path(target).name).split("/")[-1]

    def _write_release(self, directory: Path, name: str, repo_id: str | None = None) -> None:
        """The release's files: peft's, the noise statistics, ``dp_privacy.json`` and the card (peft's blank one
        replaced), the base named by Hub id or not at all. For the Hub repository ``repo_id``, a base that its
        public Hub id does not compute (none, or a mean-pooling head, which stock classes read from [CLS]) is
        pushed alongside: the repository is its own stock base and names itself."""
        super().save_model(str(directory), _internal_call=True)
        write_noise_stats(self, directory)
        record = self.privacy_record()
        set_adapter_base(directory, record.base_model)
        if repo_id is not None and self._base_goes_alongside(record):
            self._write_stock_base(directory)
            set_adapter_base(directory, repo_id)
        record.save(directory)
        write_adapter_card(directory, record, name)

    def _base_goes_alongside(self, record: PrivacyRecord) -> bool:
        """Whether a pushed sequence classifier's base must go up with it: it has no Hub id, or it pools by the
        mean (the public base's stock class would read [CLS])."""
        config = next(iter(self.model.peft_config.values()))
        if str(config.task_type) != "SEQ_CLS":
            return False
        mean = getattr(self.model.get_base_model().config, CLASSIFIER_POOLING_KEY, None) == "mean"
        return record.base_model is None or mean

    def _write_stock_base(self, directory: Path) -> None:
        """The trained model without its LoRA layers (the base's weights, the trained head) as a stock
        classifier in ``directory``, beside the adapter (:func:`save_stock_classifier`)."""
        base = copy.deepcopy(self.model).unload()
        labels = [base.config.id2label[i] for i in range(base.config.num_labels)]
        save_stock_classifier(base, directory, labels)

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        allow_seeded: bool = False,
        **kwargs: Any,
    ):
        """Under DP, upload the release only: the allow-listed adapter files, ``dp_privacy.json`` and a card with
        the privacy statement (no logs, ``trainer_state.json``, ``training_args.bin``, checkpoints or "Training
        Loss" card). A run with a fixed ``dp_seed`` is refused unless ``allow_seeded`` (the card then warns).
        The upload is always blocking (it is made from a temporary folder) and ``kwargs`` (Trainer's model-card
        fields) are not used. Without DP: Trainer's push."""
        if not self.args.dp:
            return super().push_to_hub(commit_message, blocking, token, revision, private, **kwargs)
        record = self.privacy_record()
        name = self._card_name(self.args.output_dir)
        check_unseeded_release({name: record}, allow_seeded, "push_to_hub(allow_seeded=True)")
        check_finite_weights(self._param_names, self._params)
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:
            self.init_hf_repo(token=token, private=private)
        if not self.is_world_process_zero():
            return None
        self._finish_current_push()
        with tempfile.TemporaryDirectory(prefix="hf_dpmerge-release-") as tmp:
            release = release_adapter(Path(tmp) / "release",
                                      lambda directory: self._write_release(directory, name, self.hub_model_id))
            return hf_api().upload_folder(
                repo_id=self.hub_model_id,
                folder_path=release,
                commit_message=commit_message,
                token=token,
                revision=revision if revision is not None else self.args.hub_revision,
            )
