"""human-interaction: the user directory (a live store with an API), human requests, channel adapters, answer
binding, deadlines."""

from temporality_human_interaction.answers import AnswerRefused, AnswerSubmission, bind_answer
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter, DeliveryReceipt, WebInboxAdapter
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.directory import Directory, DirectoryError, GroupProfile, UserProfile
from temporality_human_interaction.records import HumanRequestRecord
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_human_interaction.store import DirectoryStore, DirectoryWatch

__all__ = [
    "AnswerRefused",
    "AnswerSubmission",
    "ChannelAdapter",
    "DeadlineHandler",
    "DeliveryReceipt",
    "Directory",
    "DirectoryError",
    "DirectoryStore",
    "DirectoryWatch",
    "GroupProfile",
    "HumanRequestRecord",
    "RequestHandler",
    "Settings",
    "UserProfile",
    "WebInboxAdapter",
    "bind_answer",
    "create_app",
]
